"""`make pipeline-timelines`: simulated and measured timelines of GPipe and PipeDream-Flush, d = 4, m = 8.

    python -m experiments.pipeline_timelines [--out results/figures]

Simulated: the schedules replayed with backward = 2 x forward, as the paper draws them (Figures
1a and 3). Measured: the same schedules run by the dist executor on 4 gloo ranks (a tiny BERT,
one thread per rank); the last of three steps is drawn from every rank's action start/end
records. Writes pipeline_<schedule>_{simulated,measured}.png and the measured Chrome traces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from methods.pipeline.executors.torchrun import torchrun
from methods.pipeline.schedules.schedule import gpipe, one_f_one_b
from methods.pipeline.schedules.simulate import Costs, Timeline, draw, simulate, to_chrome_trace
from suite.config.paths import ROOT

D, M = 4, 8
SCHEDULES = {"gpipe": gpipe, "pipedream-flush": one_f_one_b}
# Tiny BERT whose parameter-balanced 4-way split gives each stage about two blocks' work.
MODEL = ["model.preset=tiny", "model.layers=6", "model.vocab_size=128", "seq_len=32", "micro_batch_size=2"]


def measure(path: str, steps: int = 3) -> int:
    """Rank entry point: run each method for `steps` steps; rank 0 writes the last step's records."""
    import torch

    from suite.config.run import RunConfig, apply_overrides
    from suite.core import registry
    from suite.core.check import build_method
    from suite.harness.data import synthetic_batches

    torch.set_num_threads(1)
    out = {}
    for name in SCHEDULES:
        cls = registry.get(name)
        pairs = MODEL + [f"num_micro_batches={M}", "executor=dist", f"stages={D}"]
        run = apply_overrides(RunConfig(method=name, device="cpu"), pairs, cls.options).validate()
        method = build_method(run)
        batches = synthetic_batches(run)
        for _ in range(steps):
            method.step(next(batches))
        base = (steps - 1) * M  # micro-batch ids of the drawn step, relabelled 0..M-1
        out[name] = {
            "recompute": method.opts["recompute"],
            "records": [
                dict(r, mb=None if r["mb"] is None else r["mb"] - base)
                for r in method.timeline_records()
                if r["replica"] == 0
            ],
        }
    import torch.distributed as dist

    if dist.get_rank() == 0:
        Path(path).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "results", "figures"))
    p.add_argument("--measure", metavar="JSON", help=argparse.SUPPRESS)  # the torchrun ranks' entry point
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if args.measure:
        from methods.pipeline.executors.dist import rank_main

        rank_main(lambda: measure(args.measure))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, gen in SCHEDULES.items():
        tl = simulate(gen(D, M), Costs(forward=1, backward=2))
        path = out / f"pipeline_{name}_simulated.png"
        draw(tl, path, f"{name} simulated, d={D}, m={M}, backward = 2 x forward: bubble {tl.bubble:.1%}")
        print(f"wrote {path}")

    with tempfile.TemporaryDirectory(prefix="pipeline-timelines-") as tmp:
        records = Path(tmp) / "records.json"
        proc = torchrun(D, "experiments.pipeline_timelines", ["--measure", str(records)], args.timeout)
        if proc.returncode:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            raise SystemExit(f"measuring on {D} ranks failed with exit code {proc.returncode}")
        measured = json.loads(records.read_text())
    for name, rec in measured.items():
        tl = Timeline.from_records(rec["records"], name=name)
        path = out / f"pipeline_{name}_measured.png"
        recompute = "on" if rec["recompute"] else "off"
        draw(
            tl,
            path,
            f"{name} measured, {D} ranks on {os.cpu_count()} cores, m={M}, recompute {recompute}: "
            f"bubble {tl.bubble:.0%}, {tl.makespan * 1e3:.0f} ms",
        )
        trace = out / f"pipeline_{name}_measured.trace.json"
        to_chrome_trace(tl, trace)
        print(f"wrote {path} and {trace}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
