"""2bw-reference: PipeDream-2BW's weight-update semantics in one process, the oracle for pipedream-2bw."""

from __future__ import annotations

import torch

from baselines.grad_accum import GradAccum
from suite.core.registry import StepStats, register
from suite.harness.data import MiniBatch


class _OnCurrentWeights:
    """The optimizer seen by GradAccum.step: puts the current weights back before stepping them."""

    def __init__(self, opt, owner: "TwoBWReference"):
        self.opt, self.owner = opt, owner

    def step(self, step: int) -> None:
        self.owner._restore_current()
        self.opt.step(step)

    def __getattr__(self, name):
        return getattr(self.opt, name)


@register("2bw-reference")
class TwoBWReference(GradAccum):
    """Gradient accumulation with 2BW's one-step-delayed update (paper §3.1, §3.3 'Semantics').

    Step t (0-indexed) computes the gradient of minibatch t at the weights of the previous step and
    applies it to the current ones: W(t+1) = W(t) - lr * grad f_t(W(max(t-1, 0))). Step 0 uses
    W(0) (so W(0) serves twice, as the version rule max(floor((k-1)/m) - 1, 0) has micro-batches
    1..2m on version 0). For Adam/LAMB the delay is in the gradient only: optimizer step t feeds
    grad f_t(W(t-1)) into the moments, with the trust ratio, weight decay and step size taken at
    W(t) and the LR of step t, as the pipeline's update of version t+1 does. Loss scaling and the
    global clip norm (run.clip_grad_norm) act on that delayed gradient, as in grad_accum. After N
    steps this equals pipedream-2bw's weights once its stream has drained (N updates).
    """

    steady_after = 1  # W(t-1) is kept from the first step on

    def __init__(self, model, run, device):
        super().__init__(model, run, device)
        self.opt = _OnCurrentWeights(self.opt, self)
        self.previous: list[torch.Tensor] | None = None  # W(t-1); None before the first step
        self._current: list[torch.Tensor] | None = None

    @torch.no_grad()
    def _load(self, tensors: list[torch.Tensor]) -> None:
        for p, t in zip(self.params, tensors):
            p.copy_(t)

    def _restore_current(self) -> None:
        if self._current is not None:
            self._load(self._current)
            self._current = None

    def step(self, batch: MiniBatch) -> StepStats:
        current = [p.detach().clone() for p in self.params]  # W(t)
        if self.previous is not None:
            self._current = current
            self._load(self.previous)  # gradients at W(t-1)
        try:
            stats = super().step(batch)
        finally:
            self._restore_current()  # also when the step was skipped (fp16 overflow)
        self.previous = current
        return stats

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        roles = super().memory_roles()
        return {**roles, "parameters": roles["parameters"] + list(self.previous or [])}

    def resident_device_bytes(self) -> int:
        return super().resident_device_bytes() + sum(t.numel() * t.element_size() for t in self.previous or [])
