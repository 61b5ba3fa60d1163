"""Multi-rank equivalence of L2L: run it on every torchrun rank, compare with single-rank grad_accum on rank 0.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m methods.l2l.dist_check \\
        --steps 3 --set model.layers=2 --set stash=cpu --set overlap=on

Each rank trains on its shard of the global minibatch (offsets stay global, so dropout keys match
one rank's); rank 0 also trains the reference (`--against`, one rank, the full minibatch) and
compares the updates with suite.core.check's tolerance; every rank's weights must be bitwise identical.
Every rank exits non-zero on a mismatch.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist

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


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].reshape(-1) for k in sorted(state)])


def main(argv: list[str] | None = None) -> int:
    args = rank_check_parser(__doc__.splitlines()[0], default="l2l").parse_args(argv)

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cls = registry.get(args.method)
    run = apply_overrides(RunConfig(method=args.method, ranks=world), args.set, cls.options)
    device = resolve_device(run.device, int(os.environ.get("LOCAL_RANK", 0)))
    if not any(s.startswith("precision=") for s in args.set):
        run.precision = default_precision(args.method, device)
    run = run.validate()
    subject = build_method(run, device)  # joins the process group
    w0 = subject.state_dict()
    batches = (b.shard(rank, world) for b in synthetic_batches(run, padded=True))
    reference = ref_batches = None
    ref_precision = reference_precision(run, args.against)  # (refused here, on every rank, where it is no check)
    if rank == 0:
        # The same global minibatch cut into the same micro-batches as the ranks cut their shards
        # into, so that the only differences left are the ranks' summation order.
        ref_run = dataclasses.replace(
            run,
            method=args.against,
            ranks=1,
            options={},
            precision=ref_precision,
            micro_batch_size=run.micro_batch_size // world,
            num_micro_batches=run.num_micro_batches * world,
        )
        reference, ref_batches = build_method(ref_run, device), synthetic_batches(ref_run, padded=True)
    losses, states, ref_states = [], [], []
    every = per_step(run.precision, ref_precision)  # each step's weights compared
    for i in range(args.steps):  # the weights after each step where 16-bit updates are compared step by step
        stats = subject.step(next(batches))
        kept = every or i == args.steps - 1
        if kept:
            states.append(subject.state_dict())
        ref = float("nan")
        if reference is not None:
            ref = reference.step(next(ref_batches)).loss
            if kept:
                ref_states.append(reference.state_dict())
        losses.append((stats.loss, ref))
    state = states[-1]

    # All ranks must hold one consistent model: gather every rank's weights on every rank.
    mine = _flat(state)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    identical = all(torch.equal(mine, other) for other in everyone)
    note = (f"{'all' if identical else 'NOT all'} {world} ranks hold bitwise identical weights", identical)
    label = f"{args.method} on {world} ranks"
    passed = verdict_across_ranks(subject, label, w0, states, reference, ref_states, losses, [note])
    leave_group()
    return int(not passed)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The verdict is in and the process group destroyed: leave without the interpreter's teardown, where a rank
    # was seen to abort ("terminate called without an active exception") after a passing check.
    os._exit(code)
