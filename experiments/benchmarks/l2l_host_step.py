"""L2L's host update inside a step: the fused host optimizer against the foreach one, after the backward (the paper's
Algorithm 2, overlap=off) or beside it (L2Lp, overlap=on), measured in interleaved rounds in one process."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time

import torch

from experiments.benchmarks.common import benchmark, defaults, md_table, measured
from suite.core.check import build_method
from suite.core.experiment import Row
from suite.core.registry import Option
from suite.harness.data import synthetic_batches
from suite.harness.device import synchronize

VARIANTS = [(impl, overlap) for impl in ("foreach", "fused") for overlap in ("off", "on")]
# `small`, the CPU's shape: on a CPU the "device" is the host, and a BERT-Base step of 4 x 64 tokens keeps it to about
# a second. `paper`, a GPU's: the paper's BERT-Large and L2L-CMP shape (one micro-batch of 64 x 512). `tiny`: plumbing.
SHAPES = {
    "tiny": {"model.preset": "tiny", "seq_len": 16, "micro_batch_size": 2, "precision": "fp32"},
    "small": {"model.preset": "bert-base", "seq_len": 64, "micro_batch_size": 4, "precision": "fp32"},
    "paper": {"model.preset": "bert-large", "seq_len": 512, "micro_batch_size": 64, "precision": "fp16"},
}
SETTINGS = {"rounds": Option(3, help="interleaved rounds of `steps` timed steps of every variant")}


def build(run, device: torch.device, impl: str, overlap: str):
    """The cell's L2L method with one host optimizer and one timing of the update."""
    return build_method(dataclasses.replace(run, options={"host_optim": impl, "overlap": overlap}), device)


def measure(run, device: torch.device, rounds: int, steps: int) -> dict:
    """Per variant: seconds per step (the host updates drained inside it) and the host's busy seconds per step."""
    methods = {v: build(run, device, *v) for v in VARIANTS}
    streams = {v: synthetic_batches(run) for v in VARIANTS}
    wall = {v: [] for v in VARIANTS}
    host = {v: [] for v in VARIANTS}
    for v, m in methods.items():  # one warm-up step each
        m.step(next(streams[v]))
        m.updater.drain()
    for r in range(rounds):
        for v in VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]:
            m = methods[v]
            for _ in range(steps):
                busy = m.server.busy_seconds
                synchronize(device)
                t0 = time.perf_counter()
                m.step(next(streams[v]))
                m.updater.drain()  # the host updates belong to the step that made them
                synchronize(device)
                wall[v].append(time.perf_counter() - t0)
                host[v].append(m.server.busy_seconds - busy)
    params = sum(p.numel() for p in methods[VARIANTS[0]].model.hf.parameters())
    del methods
    gc.collect()
    return {
        "wall": {f"{i}/{o}": t for (i, o), t in wall.items()},
        "host": {f"{i}/{o}": t for (i, o), t in host.items()},
        "params": params,
    }


def summarise(m: dict) -> dict:
    med = {k: statistics.median(v) for k, v in m["wall"].items()}
    host = {k: statistics.median(v) for k, v in m["host"].items()}
    out = {"rows": []}
    for key in m["wall"]:
        impl, overlap = key.split("/")
        out["rows"].append(
            {
                "host_optim": impl,
                "overlap": overlap,
                "step_s": med[key],
                "step_min": min(m["wall"][key]),
                "step_max": max(m["wall"][key]),
                "host_s": host[key],
                "host_share": host[key] / med[key],
                "ratio": med[key] / med["foreach/off"],
            }
        )
    # How much of the host update overlapping hides: the step it saves over the host time it had to hide.
    out["hidden"] = {
        impl: (med[f"{impl}/off"] - med[f"{impl}/on"]) / host[f"{impl}/off"] for impl in ("foreach", "fused")
    }
    return out


def shape_text(run, device_type: str) -> str:
    return f"{run.model.preset}, {run.micro_batch_size} x {run.seq_len} tokens, {run.precision}, LAMB, on {device_type}"


def host_step_cell(run, device: torch.device, cap) -> dict:
    """The cell: the four variants' steps in `rounds` interleaved rounds of `run.steps`, in this one process."""
    m = measure(run, device, run.options["rounds"], run.steps)
    return cell_metrics(summarise(m), m, shape_text(run, device.type), run.options["rounds"], run.steps)


def cell_metrics(summary: dict, raw: dict, shape: str, rounds: int, steps: int) -> dict:
    """A cell's record: the table's columns, the shape and rounds, every variant's summary and the raw times."""
    ratio = {f"{r['host_optim']}/{r['overlap']}": r["ratio"] for r in summary["rows"]}
    return {
        "foreach_off_step_s": summary["rows"][0]["step_s"],
        "fused_off_ratio": ratio["fused/off"],
        "fused_on_ratio": ratio["fused/on"],
        "fused_hidden": summary["hidden"]["fused"],
        "shape": shape,
        "params": raw["params"],
        "rounds": rounds,
        "steps": steps,
        "summary": summary,
        "raw": raw,
    }


def variant_line(row: dict) -> list[str]:
    step = f"{row['step_s']:.3f} ({row['step_min']:.3f}..{row['step_max']:.3f})"
    return [
        row["host_optim"],
        row["overlap"],
        step,
        f"{row['host_s']:.3f}",
        f"{row['host_share']:.0%}",
        f"{row['ratio']:.2f}x",
    ]


HEAD = "host_optim | overlap | step s (min..max) | host s | host share | ratio"


def detail(cells, records) -> list[str]:
    """The four variants of every measured cell, and how much of the host update overlapping hid."""
    lines = []
    for _, m in measured(cells, records):
        hidden = m["summary"]["hidden"]
        lines += [
            f"{m['shape']}; {m['params'] / 1e6:.0f}M parameters; {m['rounds']} rounds of {m['steps']} steps:",
            "",
            *md_table(HEAD.split(" | "), [variant_line(r) for r in m["summary"]["rows"]]),
            "",
            f"Hidden by overlapping: foreach {hidden['foreach']:.0%}, fused {hidden['fused']:.0%}.",
            "",
        ]
    return lines


def rows(profile: str) -> list[Row]:
    """One row: L2L at FP32, L2L-CMP (16-bit on the device) at fp16."""
    return [Row("host-update-variants", "l2l" if SHAPES[profile]["precision"] == "fp32" else "l2l-cmp")]


def base(profile: str) -> dict:
    return {**defaults(SETTINGS), **SHAPES[profile], "num_micro_batches": 1, "optimizer": "lamb", "steps": 3}


EXPERIMENT = benchmark(
    "bench-l2l-host-step",
    "L2L's host update inside a step (measured)",
    "the L2L paper's Algorithm 2 (the update after the backward) against L2Lp (beside it), with either host optimizer",
    [
        ("foreach_off_step_s", "step s, foreach/off", "{:.3f}"),
        ("fused_off_ratio", "fused/off ratio", "{:.2f}x"),
        ("fused_on_ratio", "fused/on ratio", "{:.2f}x"),
        ("fused_hidden", "hidden by overlapping, fused", "{:.0%}"),
    ],
    rows=rows,
    base=base,
    settings=SETTINGS,
    detail=detail,
    notes=(
        "One L2L step with its host updates drained inside it, for the four combinations of the host optimizer "
        "(`host_optim=foreach`, the suite's LAMB before #16; `fused`, the fused kernel) and the update's timing "
        "(`overlap=off`: after the whole backward, the paper's Algorithm 2; `on`: each layer's update as soon as "
        "its gradient has arrived, beside the backward of the next, L2Lp). Medians over interleaved rounds, "
        "min..max beside them; host = the param server's busy seconds (landing, unscaling, updates); ratio to "
        "foreach/off in the same run. Hidden: the step time overlapping saves, over the host time it had to hide. "
        "On a CPU the device is the host too, so overlapping competes for the same cores. `make bench-host-optim` "
        "runs it (`small` on a CPU, `paper` on a GPU)."
    ),
)
