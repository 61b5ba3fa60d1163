"""Multi-rank equivalence of a pipeline method: every torchrun rank runs it, rank 0 compares with grad_accum.

    python -m torch.distributed.run --standalone --nproc_per_node=4 -m methods.pipeline.dist_check \\
        --method pipedream-flush --steps 3 --set stages=2 --set width=2 --set model.layers=2

Every rank runs the pipeline method (executor=dist) on the same minibatches; rank 0 then trains
the reference (`--against`, one process, the same minibatches and micro-batches) and compares
every tensor's update with suite.core.check's tolerance. It also checks that each stage's replicas
hold bitwise identical weights and that the measured peak stash per stage equals the
validator's. Every rank exits non-zero on a mismatch; a failing rank prints its traceback and
exits at once so torchrun tears the others down. `--fault` injects a failure (for the tests).
"""

from __future__ import annotations

import dataclasses
import os
import time

from methods.pipeline.executors.dist import rank_main
from suite.config.run import RunConfig, apply_overrides
from suite.core import registry
from suite.core.check import (
    build_method,
    rank_check_parser,
    reference_precision,
    verdict_across_ranks,
)
from suite.harness.data import synthetic_batches
from suite.harness.device import leave_group, resolve_device


def _inject(fault: str) -> None:
    if fault == "exit":  # a rank that dies without a word
        os._exit(3)
    if fault == "hang":  # a rank that stops answering; its peers' waits must time out
        time.sleep(10**6)
    if fault == "raise":
        raise RuntimeError("injected fault")


def main(argv: list[str] | None = None) -> int:
    p = rank_check_parser(__doc__.splitlines()[0], default="pipedream-flush")
    p.add_argument("--fault", choices=["exit", "hang", "raise"], help="inject a failure (tests)")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=1)
    args = p.parse_args(argv)

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = resolve_device("auto", int(os.environ.get("LOCAL_RANK", 0)))
    cls = registry.get(args.method)
    pairs = ([] if any(s.startswith("executor=") for s in args.set) else ["executor=dist"]) + args.set
    run = apply_overrides(RunConfig(method=args.method, device=device.type), pairs, cls.options).validate()
    if cls.world_size(run) != world:
        raise SystemExit(f"{args.method} with {run.options} needs {cls.world_size(run)} ranks, got {world}")
    subject = build_method(run, device)  # joins the process group
    w0 = subject.state_dict()
    batches = synthetic_batches(run, padded=True)
    losses = []
    for step in range(args.steps):
        if args.fault and rank == args.fault_rank and step == args.fault_step:
            _inject(args.fault)
        losses.append(subject.step(next(batches)).loss)
    state = subject.state_dict()
    peaks = subject.stash_peaks()
    identical = subject.executor.replicas_identical()

    reference = None
    if rank == 0:
        ref_run = dataclasses.replace(
            run, method=args.against, options={}, precision=reference_precision(run, args.against)
        )
        reference, ref_batches = build_method(ref_run, device), synthetic_batches(ref_run, padded=True)
        losses = [(a, reference.step(next(ref_batches)).loss) for a in losses]
    o, report = subject.opts, subject.report
    label = f"{args.method} (dist, {world} ranks: stages={o['stages']} width={o['width']} recompute={o['recompute']})"
    stash_ok = peaks == report.peak_stash  # both the same on every rank: the peaks are gathered
    notes = [
        (
            f"peak stash per stage: measured {peaks}, validator {report.peak_stash} "
            f"(bound {report.stash_bound}): {'equal' if stash_ok else 'DIFFERENT'}",
            stash_ok,
        ),
        (f"replicas of every stage hold {'bitwise identical' if identical else 'DIFFERENT'} weights", identical),
    ]
    ref_states = [reference.state_dict()] if reference is not None else []  # FP32: the end's weights are the check
    passed = verdict_across_ranks(subject, label, w0, [state], reference, ref_states, losses, notes)
    leave_group()
    return int(not passed)


if __name__ == "__main__":
    rank_main(main)
