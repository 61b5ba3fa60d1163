"""Single-process interpreter of a Schedule: all stages (and replicas) in one process, messages in queues."""

from __future__ import annotations

import time
from collections import defaultdict, deque

import torch

from methods.pipeline.executors.stage import Stage, clip_coefficient, take
from methods.pipeline.schedules.schedule import (
    ALL_REDUCE,
    BACKWARD,
    FORWARD,
    OPTIMIZER_STEP,
    RECV_ACT,
    RECV_GRAD,
    RECVS,
    SEND_ACT,
    SEND_GRAD,
    Action,
    message_key,
)
from suite.harness.device import scalar

COLLECTIVE = (ALL_REDUCE, OPTIMIZER_STEP)


class ReferenceExecutor:
    """Runs the per-stage action lists of one step for `width` pipeline replicas.

    Replicas share each Stage's weights, so their gradients sum in place and ALL_REDUCE only has to
    wait until every replica of the stage reaches it. A receive blocks its stage until the matching
    send has run; stages take turns, each running until it blocks, and a replica runs only while
    the ones before it wait at ALL_REDUCE, so gradients accumulate in micro-batch order as in
    grad_accum. Each stage executes its own actions in list order, so stashes are those of the
    distributed executor. It is the test oracle and the single-device runner. Message queues
    persist across run() calls: a 2BW window may send a gradient that the next window receives.
    """

    def __init__(self, stages: list[Stage], width: int = 1, clip_grad_norm: float = 0.0):
        self.stages, self.width, self.clip = stages, width, clip_grad_norm
        self.records: list[dict] = []
        self.queues: dict = defaultdict(deque)

    def _members(self, a: Action, r: int, s: int) -> list[tuple[int, int]]:
        # A global clip norm needs every stage's gradients before any stage updates.
        if a.kind is OPTIMIZER_STEP and self.clip > 0:
            return [(q, t) for q in range(self.width) for t in range(len(self.stages))]
        return [(q, s) for q in range(self.width)]

    def run(self, actions: list[list[Action]], contexts: list[dict], update: bool = True) -> float:
        """Execute one step: `actions[s]` per stage, `contexts[r][mb]` the LayerContext of replica r's
        micro-batch mb. update=False skips OPTIMIZER_STEP (gradients stay in .grad). Returns the loss."""
        d, w = len(self.stages), self.width
        if len(actions) != d:
            raise ValueError(f"{len(actions)} action lists for {d} stages")
        if not update:
            actions = [[a for a in acts if a.kind is not OPTIMIZER_STEP] for acts in actions]
        for st in self.stages:
            st.loss.zero_()
        ptr = {(r, s): 0 for r in range(w) for s in range(d)}
        queues = self.queues
        boxes = {inst: {} for inst in ptr}
        self.records = []

        def at(inst):
            acts = actions[inst[1]]
            return acts[ptr[inst]] if ptr[inst] < len(acts) else None

        while any(at(inst) is not None for inst in ptr):
            progress = False
            for r, s in ptr:
                if progress:
                    break  # rescan from replica 0: a replica runs until it waits at the all-reduce
                while (a := at((r, s))) is not None:
                    if a.kind in COLLECTIVE:
                        members = self._members(a, r, s)
                        if not all(at(m) is not None and at(m).kind is a.kind for m in members):
                            break
                        t0 = time.perf_counter()
                        self._collective(a, members)
                        for m in members:
                            self._record(m, at(m), t0)
                            ptr[m] += 1
                    else:
                        if a.kind in RECVS and not queues[r, message_key(a)]:
                            break
                        t0 = time.perf_counter()
                        self._execute(r, a, boxes[r, s], queues, contexts[r])
                        self._record((r, s), a, t0)
                        ptr[r, s] += 1
                    progress = True
            if not progress:
                stuck = [f"replica {r} stage {s} at {at((r, s))}" for (r, s) in ptr if at((r, s))]
                raise RuntimeError("pipeline deadlock: " + "; ".join(stuck))
        return scalar(sum(st.loss for st in self.stages if st.last))

    def _execute(self, r: int, a: Action, box: dict, queues, ctxs: dict) -> None:
        st = self.stages[a.stage]
        if a.kind in RECVS:
            box[a.kind, a.mb] = queues[r, message_key(a)].popleft()
        elif a.kind in (SEND_ACT, SEND_GRAD):
            queues[r, message_key(a)].append(take(box, a.kind, a))
        elif a.kind is FORWARD:
            st.check_version(a)
            ctx = ctxs[a.mb]
            out = st.forward((r, a.mb), ctx.mb if st.first else take(box, RECV_ACT, a), ctx, a.version)
            if not st.last:
                box[SEND_ACT, a.mb] = out
        elif a.kind is BACKWARD:
            st.check_version(a)
            grad = st.backward((r, a.mb), None if st.last else take(box, RECV_GRAD, a))
            if not st.first:
                box[SEND_GRAD, a.mb] = grad
        else:
            raise ValueError(f"unknown action {a}")

    def _collective(self, a: Action, members: list[tuple[int, int]]) -> None:
        stages = [self.stages[s] for s in sorted({s for _, s in members})]
        if a.kind is ALL_REDUCE:
            for st in stages:
                st.collect_grads()  # replicas share weights: their gradients are already summed
            return
        if self.clip > 0:
            coef = clip_coefficient(torch.stack([st.grad_sq_norm() for st in stages]).sum(), self.clip)
            for st in stages:
                st.scale_grads(coef)
        for st in stages:
            st.update(a.version - 1)

    def _record(self, inst: tuple[int, int], a: Action, t0: float) -> None:
        self.records.append(
            dict(
                rank=0,
                replica=inst[0],
                stage=inst[1],
                kind=a.kind.value,
                mb=a.mb,
                version=a.version,
                peer=a.peer,
                start=t0,
                end=time.perf_counter(),
            )
        )

    def peaks(self) -> list[int]:
        """Measured peak stash (micro-batches) per stage, the largest over replicas."""
        return [max(st.peak.values(), default=0) for st in self.stages]
