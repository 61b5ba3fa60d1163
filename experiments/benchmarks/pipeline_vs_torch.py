"""Pipeline step time on CPU gloo ranks: our schedules and torch.distributed.pipelining's (peers) against one-rank AG.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m experiments.benchmarks.pipeline_vs_torch

Every rank runs one thread. Our GPipe and PipeDream-Flush (dist executor) and the registered torch peers
(methods/peers/torch_pipelining.py: GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble, ZBV, DualPipeV)
run the same model, layers, minibatches and dropout keys, recompute off. First each takes one step from a
fresh model and its update is compared with one-rank grad_accum's (the oracle's norm-wise relative error);
then all are timed in interleaved rounds, a step from a barrier to the slowest rank's end (median over the
timed steps); rank 0 alone times grad_accum. The default shape makes compute dominate the activations' trip
between ranks (see DEFAULTS), so that the speedup over one rank can approach the ideal d*m/(m+d-1). Rank 0
writes OUT.md and OUT.json with provenance. (A script under torchrun, not an in-process pytest-benchmark
timer: the timed work spans processes; the pytest-benchmark test launches this script.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from methods.peers.torch_pipelining import gloo_mixes_p2p
from methods.pipeline.executors.dist import rank_main
from suite.config.paths import ROOT
from suite.config.run import RunConfig, apply_overrides
from suite.core import registry
from suite.core.check import build_method, relative_error
from suite.harness.data import synthetic_batches
from suite.measure.provenance import provenance

# Compute-dominated on 2 ranks: per micro-batch a stage runs two 256-wide blocks over 8 x 128 tokens (about 10
# GFLOP forward and backward), while one activation crossing between the ranks is 8 x 128 x 256 FP32 = 1 MiB. The
# 128-token vocabulary keeps the embeddings lighter than a block, so the parameter-balanced split is also
# compute-balanced (embeddings + 2 blocks | 2 blocks + head).
DEFAULTS = [
    "model.preset=tiny",
    "model.hidden=256",
    "model.heads=4",
    "model.intermediate=1024",
    "model.vocab_size=128",
    "seq_len=128",
    "micro_batch_size=8",
    "num_micro_batches=8",
]
OURS = ("gpipe", "pipedream-flush")
PEERS = ("torch-gpipe", "torch-1f1b", "torch-interleaved-1f1b", "torch-zero-bubble", "torch-zbv", "torch-dualpipev")


def _timed(step, steps: int) -> list[float]:
    """Per step: from a barrier to the slowest rank's end."""
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
    return times


def _local_time(step) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def _summary(times: list[float], samples: int) -> dict:
    med = statistics.median(times)
    return {
        "step_time_median_s": med,
        "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "samples_per_s": samples / med,
        "timed_steps": len(times),
    }


def _options(name: str, d: int) -> dict:
    return {"executor": "dist", "stages": d, "recompute": False} if name in OURS else {"stages": d, "recompute": False}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up round")
    p.add_argument("--steps", type=int, default=2, help="steps per runner per round")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--methods", default=",".join(OURS + PEERS), help="comma-separated pipelines to time")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "pipeline_bench"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))  # a stalled rank fails, never hangs
    rank, d = dist.get_rank(), dist.get_world_size()
    base = apply_overrides(RunConfig(device="cpu"), DEFAULTS + args.set).validate()
    m, samples = base.num_micro_batches, base.batch_size
    names = [n for n in args.methods.split(",") if n]
    if not gloo_mixes_p2p():  # this torch's gloo cannot run the V schedules (the methods say why)
        names = [n for n in names if getattr(registry.get(n), "placement", "") != "v"]

    # Correctness before speed: one step of every pipeline from a fresh model against one-rank grad_accum.
    runs = {n: dataclasses.replace(base, method=n, options=_options(n, d)) for n in names}
    methods = {n: build_method(r) for n, r in runs.items()}
    w0 = next(iter(methods.values())).state_dict()
    batch0 = next(synthetic_batches(base))
    after = {}
    for n, method in methods.items():
        method.step(batch0)
        after[n] = method.state_dict()  # collective: every rank gathers
    errors = {}
    if rank == 0:
        ref = build_method(dataclasses.replace(base, method="grad_accum"))
        ref.step(batch0)
        want, free = ref.state_dict(), ref.model.gradient_free()  # the oracle leaves rounding-noise keys ungated
        for n, got in after.items():
            errors[n] = max(relative_error(got[k] - w0[k], want[k] - w0[k]) for k in want if k not in free)

    # Runners are timed in interleaved rounds, so a change in background load hits all alike.
    runners: dict = {}
    if rank == 0:  # one rank, one thread: the sequential baseline
        ga = build_method(dataclasses.replace(base, method="grad_accum"))
        ga_batches = synthetic_batches(base)
        runners["grad_accum (1 rank)"] = lambda: ga.step(next(ga_batches))
    else:
        runners["grad_accum (1 rank)"] = None
    for n, method in methods.items():
        batches = synthetic_batches(base)
        runners[n] = lambda method=method, batches=batches: method.step(next(batches))
    times = {name: [] for name in runners}
    order = list(runners)
    for rnd in range(args.rounds + 1):  # round 0 warms up
        # Odd rounds run in reverse, so no runner always follows the same one.
        for name in order if rnd % 2 == 0 else order[::-1]:
            fn = runners[name]
            if name.startswith("grad_accum"):
                dts = [_local_time(fn) for _ in range(args.steps)] if fn is not None else []
                dist.barrier()
            else:
                dts = _timed(fn, args.steps)
            if rnd:
                times[name] += dts
    results = {name: _summary(t, samples) for name, t in times.items() if t}

    if rank == 0:
        t_ga = results["grad_accum (1 rank)"]["step_time_median_s"]
        for n in names:
            results[n]["speedup_over_grad_accum"] = t_ga / results[n]["step_time_median_s"]
            results[n]["max_update_rel_error_vs_grad_accum"] = errors[n]
            results[n]["peer"] = registry.get(n).peer
        record = {
            "config": base.to_dict(),
            "ranks": d,
            "threads_per_rank": torch.get_num_threads(),
            "load_average_1min_at_end": os.getloadavg()[0],
            "cpu_count": os.cpu_count(),
            "micro_batches": m,
            "ideal_speedup": d * m / (m + d - 1),
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "results": results,
            "provenance": provenance(torch.device("cpu"), "tiny", None),
        }
        write(record, Path(args.out))
        print(Path(args.out).with_suffix(".md").read_text())
    dist.barrier()
    dist.destroy_process_group()
    return 0


def write(record: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2, default=str))
    c, prov, mdl = record["config"], record["provenance"], record["config"]["model"]
    lines = [
        f"# Pipeline step time: {record['ranks']} CPU gloo ranks, {record['threads_per_rank']} thread each",
        "",
        f"Model: BERT preset {mdl['preset']} (layers {mdl['layers']}, hidden {mdl['hidden']}, intermediate "
        f"{mdl['intermediate']}, vocab {mdl['vocab_size']}), seq_len {c['seq_len']}, micro-batch "
        f"{c['micro_batch_size']} x m = {record['micro_batches']}; recompute off; split by parameter count "
        "(interleaved and V schedules: 2 stages per rank).",
        f"Ideal pipeline speedup d*m/(m+d-1) = {record['ideal_speedup']:.3f}. {record['rounds']} interleaved rounds "
        f"of {record['steps_per_round']} steps per runner after a warm-up round; {record['cpu_count']} CPU cores, "
        f"1-minute load average {record['load_average_1min_at_end']:.2f} at the end (other work on the machine "
        "skews every number). Before timing, each pipeline's first step is compared with one-rank grad_accum's "
        "(largest norm-wise relative error of a tensor's update; the oracle's bound is 1e-5).",
        "",
        "| run | peer | step time median (ms) | min | max | samples/s | speedup over grad_accum | update error "
        "vs grad_accum |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in record["results"].items():
        speed = f"{r['speedup_over_grad_accum']:.3f}" if "speedup_over_grad_accum" in r else "1 (reference)"
        err = f"{r['max_update_rel_error_vs_grad_accum']:.2e}" if "max_update_rel_error_vs_grad_accum" in r else ""
        lines.append(
            f"| {name} | {r.get('peer') or ''} | {r['step_time_median_s'] * 1e3:.1f} | {r['step_time_min_s'] * 1e3:.1f}"
            f" | {r['step_time_max_s'] * 1e3:.1f} | {r['samples_per_s']:.1f} | {speed} | {err} |"
        )
    lines += [
        "",
        f"Provenance: commit {prov['commit']} (dirty {prov['dirty']}), torch {prov['torch']}, "
        f"transformers {prov['transformers']}, {prov['device']}, host {prov['host']}. "
        "Produced by `experiments/benchmarks/pipeline_vs_torch.py`; never edited by hand.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    rank_main(main)
