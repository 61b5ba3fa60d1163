"""Pipeline step time on CPU gloo ranks: ours vs torch.distributed.pipelining vs one-rank grad_accum.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m experiments.benchmarks.pipeline_vs_torch

Every rank runs one thread. The same model, split and minibatches go through our GPipe and
PipeDream-Flush (dist executor, recompute off) and through torch's ScheduleGPipe and Schedule1F1B
driving our stage modules; gradients of one step are compared first. A step is timed from a
barrier to the slowest rank's end (median over the timed steps); rank 0 alone also times
grad_accum. Rank 0 writes OUT.md and OUT.json with provenance. (A script under torchrun, not an
in-process pytest-benchmark timer: the timed work spans processes; the pytest-benchmark test
launches this script.)
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
from torch import nn

from methods.pipeline.executors.dist import rank_main
from methods.pipeline.executors.stage import Stage
from methods.pipeline.method import split_layers
from suite.config.paths import ROOT
from suite.config.run import RunConfig, apply_overrides
from suite.core.check import build_method, relative_error
from suite.harness.data import synthetic_batches
from suite.harness.model import build_model
from suite.measure.provenance import provenance

# A tiny BERT whose parameter-balanced 2-way split is also compute-balanced (embeddings + 2 blocks |
# 2 blocks + head): with the default 1024-token vocabulary the embeddings outweigh a block and the
# split would put 1 block against 3.
DEFAULTS = ["model.preset=tiny", "model.vocab_size=128", "seq_len=64", "micro_batch_size=4", "num_micro_batches=8"]


class TorchStageModule(nn.Module):
    """Our stage's layers as the module torch.distributed.pipelining drives. Both its schedules run
    forwards in micro-batch order, so the i-th call of a step is micro-batch i: that picks the
    context (labels, mask, dropout keys) a tensor-only interface cannot carry."""

    def __init__(self, stage: Stage):
        super().__init__()
        self.stage = stage
        self.blocks = nn.ModuleList(stage.model.layers[i] for i in stage.layers)  # registers the parameters
        self.ctxs, self.calls = [], 0

    def begin_step(self, ctxs) -> None:
        self.ctxs, self.calls = list(ctxs), 0

    def forward(self, x):
        ctx = self.ctxs[self.calls]
        self.calls += 1
        return self.stage.run_layers(ctx.mb if self.stage.first else x, ctx)


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


def _torch_pipeline(run, schedule_cls, batches, grads_only: bool = False):
    """torch.distributed.pipelining on our stage split; returns (one-step callable, stage)."""
    from torch.distributed.pipelining import PipelineStage

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(run.model, run.seed)
    stage = Stage(model, split_layers(model, world)[rank], rank, torch.device("cpu"), False, run)
    module = TorchStageModule(stage)
    # Static shapes, so torch does not run a metadata-inference forward (it would consume a context).
    b, seq, hidden = run.micro_batch_size, run.seq_len, run.model.hidden
    act = torch.empty(b, seq, hidden, device="meta", requires_grad=True)
    inputs = torch.empty(b, seq, dtype=torch.long, device="meta") if stage.first else act
    outputs = torch.empty((), device="meta") if stage.last else act
    pstage = PipelineStage(module, rank, world, torch.device("cpu"), input_args=inputs, output_args=outputs)
    sched = schedule_cls(pstage, run.num_micro_batches, loss_fn=lambda out, target: out, scale_grads=False)
    count = [0]

    def step():
        batch = next(batches)
        ctxs = [model.begin(mb, run.seed, count[0], batch.size) for mb in batch.split(run.num_micro_batches)]
        module.begin_step(ctxs)
        if stage.first:
            sched.step(batch.input_ids)
        else:
            sched.step(target=batch.labels, return_outputs=False)
        if not grads_only:
            stage.update(count[0])
            count[0] += 1

    return step, stage


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="timed rounds after one warm-up round")
    p.add_argument("--steps", type=int, default=4, help="steps per runner per round")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "pipeline_bench"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))  # a stalled rank fails, never hangs
    rank, d = dist.get_rank(), dist.get_world_size()
    base = apply_overrides(RunConfig(device="cpu"), DEFAULTS + args.set).validate()
    m, samples = base.num_micro_batches, base.batch_size
    opts = {"executor": "dist", "stages": d, "recompute": False}
    batch0 = next(synthetic_batches(base))

    # Gradients of one step: ours and torch's, each on a fresh model.
    ours = {}
    for name in ("gpipe", "pipedream-flush"):
        method = build_method(dataclasses.replace(base, method=name, options=opts))
        method.gradients(batch0)
        ours[name] = method
    torch_grads_err = {}
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    schedules = {"ScheduleGPipe": ScheduleGPipe, "Schedule1F1B": Schedule1F1B}
    for label, cls in schedules.items():
        step, stage = _torch_pipeline(base, cls, iter([batch0]), grads_only=True)
        step()
        mine = ours["gpipe" if label == "ScheduleGPipe" else "pipedream-flush"].stages[0]
        err = max(relative_error(a.grad, b.grad) for a, b in zip(stage.params, mine.params))
        t = torch.tensor([err], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        torch_grads_err[label] = t.item()
    for method in ours.values():
        method.stages[0].zero_grad()

    # Runners are timed in interleaved rounds, so a change in background load hits all alike.
    runners = {}
    if rank == 0:  # one rank, one thread: the sequential baseline
        ga = build_method(dataclasses.replace(base, method="grad_accum"))
        ga_batches = synthetic_batches(base)
        runners["grad_accum (1 rank)"] = lambda: ga.step(next(ga_batches))
    else:
        runners["grad_accum (1 rank)"] = None
    for name, method in ours.items():
        batches = synthetic_batches(base)
        runners[f"ours {name}"] = lambda method=method, batches=batches: method.step(next(batches))
        label = "ScheduleGPipe" if name == "gpipe" else "Schedule1F1B"
        runners[f"torch {label}"] = _torch_pipeline(base, schedules[label], synthetic_batches(base))[0]
    times = {name: [] for name in runners}
    names = list(runners)
    for rnd in range(args.rounds + 1):  # round 0 warms up
        # Odd rounds run in reverse, so no runner always follows the same one.
        for name in names if rnd % 2 == 0 else names[::-1]:
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
        ideal = d * m / (m + d - 1)
        t_ga = results["grad_accum (1 rank)"]["step_time_median_s"]
        pairs = {"gpipe": "torch ScheduleGPipe", "pipedream-flush": "torch Schedule1F1B"}
        comparison = {
            name: {
                "ours_over_torch_step_time": results[f"ours {name}"]["step_time_median_s"]
                / results[torch_name]["step_time_median_s"],
                "speedup_over_grad_accum": t_ga / results[f"ours {name}"]["step_time_median_s"],
                "torch_speedup_over_grad_accum": t_ga / results[torch_name]["step_time_median_s"],
                "max_grad_rel_error_vs_torch": torch_grads_err[torch_name.split()[1]],
            }
            for name, torch_name in pairs.items()
        }
        record = {
            "config": base.to_dict(),
            "ranks": d,
            "threads_per_rank": torch.get_num_threads(),
            "load_average_1min_at_end": os.getloadavg()[0],
            "cpu_count": os.cpu_count(),
            "micro_batches": m,
            "ideal_speedup": ideal,
            "results": results,
            "comparison": comparison,
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
    c, prov = record["config"], record["provenance"]
    lines = [
        f"# Pipeline step time: {record['ranks']} CPU gloo ranks, {record['threads_per_rank']} thread each",
        "",
        f"Model: BERT preset {c['model']['preset']} (layers {c['model']['layers']}, hidden "
        f"{c['model']['hidden']}, vocab {c['model']['vocab_size']}), seq_len {c['seq_len']}, micro-batch "
        f"{c['micro_batch_size']} x m = {record['micro_batches']}; recompute off; split by parameter count.",
        f"Ideal pipeline speedup d*m/(m+d-1) = {record['ideal_speedup']:.3f}. Runners timed in "
        f"interleaved rounds; {record['cpu_count']} CPU cores, 1-minute load average "
        f"{record['load_average_1min_at_end']:.2f} at the end (other work on the machine skews every number).",
        "",
        "| run | step time median (ms) | min | max | samples/s |",
        "|---|---|---|---|---|",
    ]
    for name, r in record["results"].items():
        lines.append(
            f"| {name} | {r['step_time_median_s'] * 1e3:.2f} | {r['step_time_min_s'] * 1e3:.2f} | "
            f"{r['step_time_max_s'] * 1e3:.2f} | {r['samples_per_s']:.1f} |"
        )
    lines += [
        "",
        "| schedule | ours / torch step time | our speedup over grad_accum | torch's speedup | ideal "
        "| max grad rel. error vs torch |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in record["comparison"].items():
        lines.append(
            f"| {name} | {r['ours_over_torch_step_time']:.3f} | {r['speedup_over_grad_accum']:.3f} | "
            f"{r['torch_speedup_over_grad_accum']:.3f} | {record['ideal_speedup']:.3f} | "
            f"{r['max_grad_rel_error_vs_torch']:.2e} |"
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
