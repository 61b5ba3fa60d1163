"""PipeDream-2BW: one 1F1B stream without flushes, double-buffered weights, update W(t+1) = W(t) - lr * grad(W(t-1))."""

from __future__ import annotations

from typing import ClassVar

import torch

from methods.pipeline.method import PipelineMethod, pipeline_options
from methods.pipeline.schedules.schedule import Action, two_bw_drain, two_bw_window
from suite.core.registry import register
from suite.harness.data import MiniBatch


@register("pipedream-2bw")
class PipeDream2BW(PipelineMethod):
    """PipeDream-2BW (paper §3.1): every stage keeps the latest and the shadow weight version.

    A run of N step() calls is the schedule two_bw(d, m, N), cut into windows: step(batch t) runs,
    per stage, the actions up to the first one that needs minibatch t+1 or that applies group t's
    gradients (two_bw_window), carrying the in-flight micro-batches, their stashes and unreceived
    gradients into the next call. The first window is the warm-up; the drain (the last group's
    outstanding backwards and update) runs when the weights are read (state_dict / finish), after
    which the next step() starts a fresh stream on the versions it left, so the version rule and
    the semantics stay exact. Update t therefore lands during step t+1 (or the drain).
    """

    schedule_name = "2bw"
    reference = "2bw-reference"  # its own delayed-update reference, the default of `suite check pipedream-2bw`
    options = pipeline_options(recompute=False)
    stage_versions: ClassVar[int] = 2
    steady_after: ClassVar[int] = 2  # the first window stashes no second version; the second does
    schedule_steps: ClassVar[int] = 3  # warm-up window, a periodic window (the rest are shifts), drain

    def __init__(self, model, run, device):
        super().__init__(model, run, device)
        self.stream_start = 0  # minibatch at which the current 1F1B stream began
        self.in_flight = False  # whether the stream has un-drained work
        self.last_contexts: dict[int, dict] = {}

    def _execute(self, actions: list[list[Action]], ctxs: dict[int, dict], carry: bool) -> float:
        if self.distributed:
            s, r = self.stages[0].index, self.replicas[0]
            return self.executor.run(actions[s], ctxs[r], carry=carry)
        return self.executor.run(actions, [ctxs[r] for r in self.replicas])

    def _run(self, batch: MiniBatch, update: bool) -> float:
        if not update:
            raise RuntimeError(
                "pipedream-2bw has no update-free step: its windows apply the previous "
                "minibatch's update (compare gradients with a flush schedule instead)"
            )
        ctxs = self._contexts(batch)
        # The window also runs the previous minibatch's outstanding backwards (their receives need shapes).
        both = {r: {**self.last_contexts.get(r, {}), **ctxs[r]} for r in ctxs}
        loss = self._execute(two_bw_window(self.d, self.m, self.step_count, self.stream_start), both, carry=True)
        self.last_contexts, self.in_flight = ctxs, True
        return loss

    def finish(self) -> None:
        """Drain the stream: finish the last minibatch's backwards and apply its update (collective
        under dist). A later step() starts a new stream (warm-up again) on the same versions."""
        if not self.in_flight:
            return
        self._execute(two_bw_drain(self.d, self.m, self.step_count, self.stream_start), self.last_contexts, carry=False)
        self.in_flight, self.stream_start, self.last_contexts = False, self.step_count, {}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights after every update of the steps taken so far: drains the stream first."""
        self.finish()
        return super().state_dict()
