"""Host optimizer speed: ns per parameter of the suite's LAMB and AdamW (as L2L's param server runs them) against
torch's fused and foreach AdamW and DeepSpeed's CPU Adam, at one thread and all, for one BERT-Large layer and the
whole 335M-parameter model; a triad (c = a + s*b) at the same size gives the memory bandwidth to compare with."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from suite.config.paths import RESULTS_DIR
from suite.config.run import ModelConfig, RunConfig
from suite.harness import fused_lamb
from suite.harness.model import build_model
from suite.harness.optim import LayerwiseOptimizer
from suite.measure.machine import describe, fingerprint
from suite.measure.provenance import provenance

# Bytes an update must stream per parameter at best: AdamW reads w, g, m, v and writes w, m, v; LAMB's two passes
# read w, g, m, v and write m, v, then read w, m, v and write w. The triad reads two floats and writes a third that
# it never read, whose cache line the CPU reads first all the same (write-allocate): 16 bytes.
BYTES = {"adamw": 28, "lamb": 40, "triad": 16}
# The paper's L2L-CMP step (L2L Table 2: 256 samples at 52.48 samples/s on 4 V100s), for the host update's share.
PAPER_STEP_S = 256 / 52.48
TARGETS = {"adamw": 1.05, "lamb": 1.6}  # the ratio to the faster of torch's fused AdamW and DeepSpeed's CPU Adam
SIZES = ("layer", "model")


def bert_large_layers() -> list[list[tuple[str, torch.Size]]]:
    """(name, shape) of every parameter of BERT-Large, layer by layer as the param server holds them."""
    with torch.device("meta"):
        model = build_model(ModelConfig(preset="bert-large"), 0)
    return [[(n, p.shape) for n, p in model.layer_named_parameters(i)] for i in range(model.num_layers)]


def make_params(layers: list[list[tuple[str, torch.Size]]]) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Real FP32 weights and gradients of those shapes, as contiguous host tensors (gradients kept in .grad).
    Every candidate steps on them; the fused LAMB leaves its updates in .grad, so later steps run on other values
    of the same sizes (the timing does not depend on them)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for named in layers:
        row = []
        for name, shape in named:
            p = torch.nn.Parameter(torch.empty(shape).normal_(0, 0.02, generator=gen))
            p.grad = torch.empty(shape).normal_(0, 1e-3, generator=gen)
            row.append((name, p))
        out.append(row)
    return out


def _deepspeed_adam():
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception:  # noqa: BLE001 — not installed, or its import fails: the row is left out and says why
        return None
    return DeepSpeedCPUAdam


def candidates(layers, deepspeed: bool = True) -> dict[str, tuple[str, object]]:
    """name -> (update kind, a maker of a step function over `layers`)."""
    flat = [p for named in layers for _, p in named]

    def suite(optimizer: str, impl: str):
        run = RunConfig(optimizer=optimizer, lr=1e-4, weight_decay=0.01).validate()

        def make():
            opt = LayerwiseOptimizer(layers, run, impl=impl, host=True)
            return lambda: opt.step(0)

        return make

    def torch_adamw(**kw):
        def make():
            opt = torch.optim.AdamW(flat, lr=1e-4, weight_decay=0.01, **kw)
            return opt.step

        return make

    out = {
        "suite LAMB, fused (L2L's host)": ("lamb", suite("lamb", "fused")),
        "suite LAMB, foreach (before)": ("lamb", suite("lamb", "foreach")),
        "suite AdamW, fused (L2L's host)": ("adamw", suite("adamw", "fused")),
        "suite AdamW, foreach (before)": ("adamw", suite("adamw", "foreach")),
        "torch AdamW, fused": ("adamw", torch_adamw(fused=True)),
        "torch AdamW, foreach": ("adamw", torch_adamw(foreach=True)),
    }
    ds = _deepspeed_adam() if deepspeed else None
    if ds is not None:

        def make():
            opt = ds(flat, lr=1e-4, weight_decay=0.01, adamw_mode=True)
            return opt.step

        out["DeepSpeed CPU Adam (AdamW mode)"] = ("adamw", make)
    return out


def _omp_runtimes() -> list:
    """The OpenMP runtimes this process has loaded besides torch's own: DeepSpeed's extension links the system's
    libgomp, whose thread count torch.set_num_threads does not reach. Only loaded ones (loading a second vendor's
    runtime can abort the process)."""
    try:
        with open("/proc/self/maps") as f:
            loaded = f.read()
    except OSError:
        return []
    found = []
    for name in ("gomp", "omp", "iomp5"):
        path = ctypes.util.find_library(name)
        if path and f"/{path}" in loaded:
            try:
                found.append(ctypes.CDLL(path))
            except OSError:
                pass
    return found


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    for lib in _omp_runtimes():
        lib.omp_set_num_threads(n)


def triad(numel: int, steps: int) -> list[float]:
    """Seconds per c = a + s*b over `numel` floats: the bandwidth an update streams at, at best."""
    a, b, c = torch.rand(numel), torch.rand(numel), torch.empty(numel)
    torch.add(a, b, alpha=0.5, out=c)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        torch.add(a, b, alpha=0.5, out=c)
        times.append(time.perf_counter() - t0)
    return times


def measure(layers, threads: int, rounds: int, steps: int, deepspeed: bool = True) -> dict:
    """Seconds per step of each candidate at `threads`, in interleaved rounds (each round builds each optimizer
    anew, warms it up one step, times `steps` steps); the triad, and each candidate on one-element tensors of the
    same structure (its fixed cost per step), are timed in each round too."""
    set_threads(threads)
    numel = sum(p.numel() for named in layers for _, p in named)
    makers = candidates(layers, deepspeed)
    times: dict[str, list[float]] = {name: [] for name in [*makers, "triad"]}
    # The same tensors at one element each: what a step costs whatever the sizes (Python, dispatch, launches).
    tiny = make_params([[(n, torch.Size([1])) for n, _ in named] for named in layers])
    fixed: dict[str, list[float]] = {name: [] for name in makers}
    for r in range(rounds):
        order = list(makers)
        order = order[r % len(order) :] + order[: r % len(order)]  # rotate, so no candidate always goes first
        for name in order:
            step = makers[name][1]()
            step()  # state made, kernels loaded
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t0)
            del step
            gc.collect()
        times["triad"] += triad(numel, steps)
        for name, (_, make) in candidates(tiny, deepspeed).items():
            step = make()
            step()
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                fixed[name].append(time.perf_counter() - t0)
    kinds = {name: kind for name, (kind, _) in makers.items()}
    kinds["triad"] = "triad"
    return {
        "threads": threads,
        "numel": numel,
        "rounds": rounds,
        "times": by_round(times, rounds, steps),
        "fixed": by_round(fixed, rounds, steps),
        "kinds": kinds,
    }


def by_round(times: dict[str, list[float]], rounds: int, steps: int) -> dict[str, list[float]]:
    """Samples collected round after round (`steps` a round), reordered so that [r::rounds] is round r's."""
    return {k: [v[r * steps + i] for i in range(steps) for r in range(rounds)] for k, v in times.items()}


def summarise(m: dict) -> list[dict]:
    """Per candidate: median ns/param with the spread (min..max), GB/s at its ideal bytes, and its ratio to the
    faster of torch's fused AdamW and DeepSpeed's CPU Adam (the one with the lower median over the run): taken
    round by round (each candidate's median in a round over that reference's median in the same round), then the
    median of those with their min..max, so that a slow spell of the machine falls on both sides of a ratio.
    The reference is chosen once, not round by round: the lower of two noisy times is biased low, so a per-round
    minimum would put even the references themselves above 1x."""
    numel, rounds = m["numel"], m["rounds"]
    per_round = {k: [statistics.median(v[r::rounds]) for r in range(rounds)] for k, v in m["times"].items()}
    refs = [k for k in ("torch AdamW, fused", "DeepSpeed CPU Adam (AdamW mode)") if k in per_round]
    ref = min(refs, key=lambda k: statistics.median(m["times"][k]))
    best = per_round[ref]
    fixed_us = {k: statistics.median(v) * 1e6 for k, v in m.get("fixed", {}).items() if v}
    rows = []
    for name, ts in m["times"].items():
        kind = m["kinds"][name]
        ns = statistics.median(ts) / numel * 1e9
        ratios = None if kind == "triad" else [per_round[name][r] / best[r] for r in range(rounds)]
        rows.append(
            {
                "name": name,
                "kind": kind,
                "ns_per_param": ns,
                "ns_min": min(ts) / numel * 1e9,
                "ns_max": max(ts) / numel * 1e9,
                "gb_per_s": BYTES[kind] / ns,
                "ratio": None if ratios is None else statistics.median(ratios),
                "ratio_min": None if ratios is None else min(ratios),
                "ratio_max": None if ratios is None else max(ratios),
                "ratio_to": ref,
                "target": TARGETS.get(kind) if name.startswith("suite") and "fused" in name else None,
                "fixed_us": fixed_us.get(name),
                "fixed_share": None if name not in fixed_us else fixed_us[name] * 1e-6 / statistics.median(ts),
                "samples": len(ts),
            }
        )
    return rows


def section_head(record: dict, tail: str) -> list[str]:
    """A benchmark record's section title and hardware line: machine, commit (dirty or not), date, then `tail`."""
    prov = record["provenance"]
    commit = prov["commit"][:7] if prov["commit"] else "?"
    return [
        "",
        f"## {record['machine']['slug']}",
        "",
        f"{describe(record['machine'])}. Commit {commit}{' (dirty)' * bool(prov['dirty'])}; {record['date']}; {tail}",
    ]


def render(results_dir: Path) -> str:
    """One section per machine (ratios only within a run), every run's rows as measured."""
    lines = [
        "# Host optimizer: ns per parameter (measured)",
        "",
        "What L2L's param server spends per parameter per step, against torch's fused and foreach AdamW and "
        "DeepSpeed's CPU Adam (AdamW mode). Medians over interleaved rounds (each round builds each optimizer "
        "anew, warms it up one step and times a few), min..max beside them. GB/s: the bytes an update must stream "
        "at best "
        f"({BYTES['adamw']} per parameter for AdamW, {BYTES['lamb']} for two-pass LAMB, {BYTES['triad']} for the "
        "triad c = a + s*b, timed in the same rounds as the bandwidth reachable). Ratio: to the faster of torch's "
        "fused AdamW and DeepSpeed's CPU Adam (the lower median over the run, named under each table), round by "
        "round (each round's medians), the median over the rounds with their min..max; the target is judged on "
        "that median. Targets: the suite's fused AdamW <= 1.05x, its "
        "fused LAMB <= 1.6x. Fixed µs/step: the same update over the same tensors at one element each (Python, "
        "dispatch, thread start-up: what a step costs whatever its sizes), median over the rounds, and its share of "
        "the full step's median. Generated by `make bench-host-optim` (`python -m experiments.benchmarks.host_optim`).",
        "",
        f"The share of an L2L step is **projected**: this machine's measured seconds for the whole model's update "
        f"against the paper's L2L-CMP step, {PAPER_STEP_S:.2f} s (Table 2: 256 samples at 52.48 samples/s on 4 "
        "V100s), as if the update ran after the backward (overlap=off); measured apart, not together.",
    ]
    for f in sorted((results_dir / "host_optim").glob("*.json")):
        r = json.loads(f.read_text())
        lines += section_head(
            r,
            f"DeepSpeed {r['deepspeed'] or 'not installed'}; "
            f"fused LAMB kernel {'built' if r['fused_lamb'] else 'unavailable (foreach fallback)'}.",
        )
        for run in r["runs"]:
            lines += [
                "",
                f"**{run['size']}** ({run['numel'] / 1e6:.1f}M parameters), **{run['threads']} thread(s)**, "
                f"{run['rows'][0]['samples']} steps each:",
                "",
                "| update | ns/param (min..max) | GB/s | ratio (min..max over rounds) | target | met "
                "| fixed µs/step (share) |",
                "|---|---|---|---|---|---|---|",
            ]
            for row in run["rows"]:
                ratio = (
                    "—"
                    if row["ratio"] is None
                    else f"{row['ratio']:.2f}x ({row['ratio_min']:.2f}..{row['ratio_max']:.2f})"
                )
                target = "—" if row["target"] is None else f"<= {row['target']}x"
                met = "—" if row["target"] is None else ("yes" if row["ratio"] <= row["target"] else "**no**")
                fixed = "—" if row.get("fixed_us") is None else f"{row['fixed_us']:.0f} ({row['fixed_share']:.1%})"
                lines.append(
                    f"| {row['name']} | {row['ns_per_param']:.3f} ({row['ns_min']:.3f}..{row['ns_max']:.3f}) | "
                    f"{row['gb_per_s']:.1f} | {ratio} | {target} | {met} | {fixed} |"
                )
            lines += ["", f"Ratios to: {run['rows'][0]['ratio_to']}."]
            if run["size"] == "model":
                shares = [
                    f"{row['name']} {row['ns_per_param'] * run['numel'] / 1e9:.2f} s "
                    f"({row['ns_per_param'] * run['numel'] / 1e9 / PAPER_STEP_S:.0%})"
                    for row in run["rows"]
                    if row["name"].startswith("suite")
                ]
                lines += ["", f"Whole-model update, and its projected share of the paper's step: {'; '.join(shares)}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default=",".join(SIZES), help="layer, model or both (comma-separated)")
    p.add_argument("--threads", default="1,all", help="thread counts, 'all' for every usable core")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", default="layer=10,model=3", help="timed steps per round, per size")
    args = p.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        p.error(f"--sizes: {bad} is not among {list(SIZES)}")
    steps = dict(kv.split("=") for kv in args.steps.split(","))
    usable = torch.get_num_threads()
    threads = [usable if t == "all" else int(t) for t in args.threads.split(",")]
    all_layers = bert_large_layers()
    shapes = {"layer": [all_layers[1]], "model": all_layers}  # layer 1: the first encoder layer (12.6M)
    ds = _deepspeed_adam()
    record = {
        "machine": fingerprint(),
        "provenance": provenance(torch.device("cpu"), "paper", None),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "deepspeed": getattr(__import__("deepspeed"), "__version__", None) if ds else None,
        "fused_lamb": fused_lamb.kernel() is not None,
        "runs": [],
    }
    for size in sizes:
        layers = make_params(shapes[size])
        for t in threads:
            m = measure(layers, t, args.rounds, int(steps.get(size, 3)))
            rows = summarise(m)
            record["runs"].append(
                {
                    "size": size,
                    "threads": t,
                    "numel": m["numel"],
                    "rows": rows,
                    "raw": m["times"],
                    "fixed_raw": m["fixed"],
                }
            )
            for row in rows:
                print(f"{size} t={t} {row['name']}: {row['ns_per_param']:.3f} ns/param, {row['gb_per_s']:.1f} GB/s")
        del layers
        gc.collect()
    set_threads(usable)
    out = RESULTS_DIR / "host_optim"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{record['machine']['slug']}.json").write_text(json.dumps(record, indent=1, default=str))
    (RESULTS_DIR / "host_optim.md").write_text(render(RESULTS_DIR))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
