"""Pipeline step time on CPU gloo ranks: our schedules and torch.distributed.pipelining's (peers) against one-rank AG.

One cell on d ranks (the row's `stages`, 2 by default), every rank one thread. Our GPipe and PipeDream-Flush (dist
executor) and the registered torch peers (methods/peers/torch_pipelining.py: GPipe, 1F1B, interleaved 1F1B,
interleaved zero bubble, ZBV, DualPipeV) run the same model, layers, minibatches and dropout keys, recompute off.
First each takes one step from a fresh model and its update is compared with one-rank grad_accum's (the oracle's
norm-wise relative error); then all are timed in interleaved rounds, a step from a barrier to the slowest rank's end
(median over the timed steps); rank 0 alone times grad_accum. The default shape makes compute dominate the
activations' trip between ranks (see SHAPE), so that the speedup over one rank can approach the ideal d*m/(m+d-1).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

import torch
import torch.distributed as dist

from experiments.benchmarks.common import benchmark, defaults, md_table, measured
from methods.peers.torch_pipelining import gloo_mixes_p2p
from methods.pipeline.executors.dist import init_distributed
from suite.core import registry
from suite.core.check import build_method, relative_error
from suite.core.experiment import Row
from suite.core.registry import Option
from suite.harness.data import synthetic_batches

# Compute-dominated on 2 ranks: per micro-batch a stage runs two 256-wide blocks over 8 x 128 tokens (about 10
# GFLOP forward and backward), while one activation crossing between the ranks is 8 x 128 x 256 FP32 = 1 MiB. The
# 128-token vocabulary keeps the embeddings lighter than a block, so the parameter-balanced split is also
# compute-balanced (embeddings + 2 blocks | 2 blocks + head).
SHAPE = {
    "model.preset": "tiny",
    "model.hidden": 256,
    "model.heads": 4,
    "model.intermediate": 1024,
    "model.vocab_size": 128,
    "seq_len": 128,
    "micro_batch_size": 8,
    "num_micro_batches": 8,
}
OURS = ("gpipe", "pipedream-flush")
PEERS = ("torch-gpipe", "torch-1f1b", "torch-interleaved-1f1b", "torch-zero-bubble", "torch-zbv", "torch-dualpipev")
SETTINGS = {
    "rounds": Option(5, help="timed rounds after one warm-up round, `steps` steps of every runner each"),
    "pipelines": Option(",".join(OURS + PEERS), help="the pipelines to time, comma-separated"),
}
REFERENCE = "grad_accum (1 rank)"


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


def _summary(name: str, times: list[float], samples: int) -> dict:
    med = statistics.median(times)
    return {
        "run": name,
        "step_time_median_s": med,
        "step_time_min_s": min(times),
        "step_time_max_s": max(times),
        "samples_per_s": samples / med,
        "timed_steps": len(times),
    }


def _options(name: str, d: int) -> dict:
    return {"executor": "dist", "stages": d, "recompute": False} if name in OURS else {"stages": d, "recompute": False}


def update_errors(base, methods: dict, rank: int) -> dict[str, float]:
    """Correctness before speed: one step of every pipeline from a fresh model against one-rank grad_accum's, the
    largest norm-wise relative error of a tensor's update (collective; rank 0 returns them, the others {})."""
    w0 = next(iter(methods.values())).state_dict()
    batch0 = next(synthetic_batches(base))
    after = {}
    for n, method in methods.items():
        method.step(batch0)
        after[n] = method.state_dict()  # collective: every rank gathers
    if rank:
        return {}
    ref = build_method(dataclasses.replace(base, method="grad_accum"))
    ref.step(batch0)
    want, free = ref.state_dict(), ref.model.gradient_free()  # the oracle leaves rounding-noise keys ungated
    return {
        n: max(relative_error(got[k] - w0[k], want[k] - w0[k]) for k in want if k not in free)
        for n, got in after.items()
    }


def timed_rounds(base, methods: dict, rank: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Every runner's step times in interleaved rounds after a warm-up round (odd rounds in reverse order, so no
    runner always follows the same one), so that a change in background load hits all alike."""
    runners: dict = {REFERENCE: None}
    if rank == 0:  # one rank, one thread: the sequential baseline
        ga = build_method(dataclasses.replace(base, method="grad_accum"))
        ga_batches = synthetic_batches(base)
        runners[REFERENCE] = lambda: ga.step(next(ga_batches))
    for n, method in methods.items():
        batches = synthetic_batches(base)
        runners[n] = lambda method=method, batches=batches: method.step(next(batches))
    times = {name: [] for name in runners}
    order = list(runners)
    for rnd in range(rounds + 1):  # round 0 warms up
        for name in order if rnd % 2 == 0 else order[::-1]:
            fn = runners[name]
            if name == REFERENCE:
                dts = [_local_time(fn) for _ in range(steps)] if fn is not None else []
                dist.barrier()
            else:
                dts = _timed(fn, steps)
            if rnd:
                times[name] += dts
    return times


def pipeline_bench_cell(run, device: torch.device, cap) -> dict:
    """The cell, on every rank: every pipeline's first update checked, then all timed; rank 0's figures are its
    record."""
    torch.set_num_threads(1)
    rank, d = init_distributed(device, 600.0)  # a stalled rank fails, never hangs
    base = dataclasses.replace(run, method="grad_accum", options={})
    names = [n for n in run.options["pipelines"].split(",") if n]
    if not gloo_mixes_p2p():  # this torch's gloo cannot run the V schedules (the methods say why)
        names = [n for n in names if getattr(registry.get(n), "placement", "") != "v"]
    methods = {n: build_method(dataclasses.replace(base, method=n, options=_options(n, d))) for n in names}
    errors = update_errors(base, methods, rank)
    times = timed_rounds(base, methods, rank, run.options["rounds"], run.steps)
    if rank:
        return {}
    results = {name: _summary(name, t, base.batch_size) for name, t in times.items()}
    t_ga = results[REFERENCE]["step_time_median_s"]
    for n in names:
        results[n]["speedup_over_grad_accum"] = t_ga / results[n]["step_time_median_s"]
        results[n]["max_update_rel_error_vs_grad_accum"] = errors[n]
        results[n]["peer"] = registry.get(n).peer
    setup = {
        "ideal_speedup": d * base.num_micro_batches / (base.num_micro_batches + d - 1),
        "ranks": d,
        "threads_per_rank": torch.get_num_threads(),
        "load_average_1min_at_end": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
        "micro_batches": base.num_micro_batches,
        "rounds": run.options["rounds"],
        "steps_per_round": run.steps,
    }
    return cell_metrics(list(results.values()), setup)  # in the order they ran: the reference first


def cell_metrics(results: list[dict], setup: dict) -> dict:
    """A cell's record: the table's columns, the setup (ranks, rounds, the machine's load) and every runner's times."""
    pipelines = [r for r in results if "speedup_over_grad_accum" in r]
    fastest = max(pipelines, key=lambda r: r["speedup_over_grad_accum"])
    return {
        "best_speedup": fastest["speedup_over_grad_accum"],
        "fastest": fastest["run"],
        "max_update_error": max(r["max_update_rel_error_vs_grad_accum"] for r in pipelines),
        **setup,
        "results": results,
    }


def result_line(r: dict) -> list[str]:
    speed = f"{r['speedup_over_grad_accum']:.3f}" if "speedup_over_grad_accum" in r else "1 (reference)"
    err = f"{r['max_update_rel_error_vs_grad_accum']:.2e}" if "max_update_rel_error_vs_grad_accum" in r else ""
    times = [f"{r[k] * 1e3:.1f}" for k in ("step_time_median_s", "step_time_min_s", "step_time_max_s")]
    return [r["run"], r.get("peer") or "", *times, f"{r['samples_per_s']:.1f}", speed, err]


HEAD = (
    "run | peer | step time median (ms) | min | max | samples/s | speedup over grad_accum | update error vs grad_accum"
)


def detail(cells, records) -> list[str]:
    """Every runner of every measured cell: step times, speedup over one-rank grad_accum, first-update error."""
    lines = []
    for cell, m in measured(cells, records):
        run, mdl = cell.run, cell.run.model.resolved()
        lines += [
            f"{m['ranks']} CPU gloo ranks, {m['threads_per_rank']} thread each. Model: BERT preset {mdl.preset} "
            f"(layers {mdl.layers}, hidden {mdl.hidden}, intermediate {mdl.intermediate}, vocab {mdl.vocab_size}), "
            f"seq_len {run.seq_len}, micro-batch {run.micro_batch_size} x m = {m['micro_batches']}; recompute off; "
            "split by parameter count (interleaved and V schedules: 2 stages per rank). "
            f"Ideal pipeline speedup d*m/(m+d-1) = {m['ideal_speedup']:.3f}. {m['rounds']} interleaved rounds of "
            f"{m['steps_per_round']} steps per runner after a warm-up round; {m['cpu_count']} CPU cores, 1-minute "
            f"load average {m['load_average_1min_at_end']:.2f} at the end (other work on the machine skews every "
            "number).",
            "",
            *md_table(HEAD.split(" | "), [result_line(r) for r in m["results"]]),
            "",
        ]
    return lines


EXPERIMENT = benchmark(
    "bench-pipeline",
    "Pipeline step time on CPU gloo ranks: our schedules and torch.distributed.pipelining's against one-rank AG",
    "the PipeDream-2BW paper's schedules (GPipe, PipeDream-Flush) beside torch.distributed.pipelining's",
    [
        ("ideal_speedup", "ideal speedup", "{:.3f}"),
        ("best_speedup", "best speedup over grad_accum", "{:.3f}"),
        ("max_update_error", "largest update error", "{:.2e}"),
    ],
    # The row's method is the first pipeline: its `stages` set the ranks the runner starts (torchrun).
    rows=lambda profile: [Row("pipelines", "gpipe", _options("gpipe", 2))],
    base=lambda profile: {**defaults(SETTINGS), **SHAPE, "device": "cpu", "steps": 2},
    timeout=lambda profile: 1800.0,
    settings=SETTINGS,
    detail=detail,
    notes=(
        "The same shape at every profile: a benchmark of CPU gloo ranks. Before timing, each pipeline's first step "
        "is compared with one-rank grad_accum's (largest norm-wise relative error of a tensor's update; the "
        "oracle's bound is 1e-5). `make pipeline-bench` runs it; `--set pipelines=gpipe,torch-1f1b` times a few, "
        "`--set stages=4` on 4 ranks."
    ),
)
