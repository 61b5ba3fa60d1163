"""Multi-rank equivalence of a peer: every torchrun rank runs it, rank 0 compares its weights with grad_accum's.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m methods.peers.dist_check \\
        --method torch-1f1b --steps 3 --set stages=2 --set model.layers=2

A pipeline peer (shards_batch False) takes the whole minibatch on every rank; a data-parallel one (FSDP2,
DeepSpeed) its shard, against a reference that cuts the same global minibatch into the same micro-batches
(offsets stay global, so dropout keys match). The weights are gathered on every rank; rank 0 trains the
reference and compares each tensor's update with suite.core.check's tolerance. Every rank exits non-zero on
a mismatch; a failing rank prints its traceback and exits at once so torchrun tears the others down.
"""

from __future__ import annotations

import dataclasses
import os

from methods.pipeline.executors.dist import rank_main
from suite.config.run import RunConfig, apply_overrides
from suite.core import registry
from suite.core.check import (
    build_method,
    default_precision,
    per_step,
    rank_check_parser,
    reference_precision,
    verdict_across_ranks,
)
from suite.harness.data import synthetic_batches
from suite.harness.device import leave_group, resolve_device


def main(argv: list[str] | None = None) -> int:
    p = rank_check_parser(
        __doc__.splitlines()[0], action="append", required=True, help="repeatable: checked one after another"
    )
    args = p.parse_args(argv)

    failed = [name for name in args.method if not check_one(name, args)]
    if int(os.environ.get("RANK", 0)) == 0 and len(args.method) > 1:
        tail = f"; FAILED: {failed}" if failed else ""
        print(f"{len(args.method) - len(failed)} of {len(args.method)} passed{tail}")
    leave_group()
    return int(bool(failed))


def check_one(method: str, args) -> bool:
    """Check one peer on every rank (the process group stays up for the next); True when it passed."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cls = registry.get(method)
    ranks = [f"ranks={world}"] if cls.shards_batch else []
    run = apply_overrides(RunConfig(method=method), ranks + args.set, cls.options)
    device = resolve_device(run.device, int(os.environ.get("LOCAL_RANK", 0)))
    if not any(s.startswith("precision=") for s in args.set):
        run.precision = default_precision(method, device)
    run = run.validate()
    if cls.world_size(run) != world:
        raise SystemExit(f"{method} with {run.options} needs {cls.world_size(run)} ranks, got {world}")
    subject = build_method(run, device)  # joins the process group
    w0 = subject.state_dict()
    batches = synthetic_batches(run, padded=True)
    if cls.shards_batch:
        batches = (b.shard(rank, world) for b in batches)
    losses, states = [], []
    ref_precision = reference_precision(run, args.against)
    every = per_step(run.precision, ref_precision)  # each step's weights compared
    for i in range(args.steps):  # the weights after each step where 16-bit updates are compared step by step
        losses.append(subject.step(next(batches)).loss)
        if every or i == args.steps - 1:
            states.append(subject.state_dict())

    reference, ref_states = None, []
    if rank == 0:
        ref_run = dataclasses.replace(run, method=args.against, options={}, ranks=1, precision=ref_precision)
        if cls.shards_batch:  # the ranks' micro-batches, one after another on one rank
            ref_run = dataclasses.replace(
                ref_run, micro_batch_size=run.micro_batch_size // world, num_micro_batches=run.num_micro_batches * world
            )
        reference, ref_batches = build_method(ref_run, device), synthetic_batches(ref_run, padded=True)
        for i, a in enumerate(losses):
            losses[i] = (a, reference.step(next(ref_batches)).loss)
            if every or i == len(losses) - 1:
                ref_states.append(reference.state_dict())
    label = f"{method} on {world} ranks ({', '.join(f'{k}={v}' for k, v in subject.opts.items())})"
    return verdict_across_ranks(subject, label, w0, states, reference, ref_states, losses)


if __name__ == "__main__":
    rank_main(main)
