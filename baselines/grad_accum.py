"""AG: gradient accumulation over micro-batches in FP32, the reference every method is checked against."""

from __future__ import annotations

import torch

from suite.core.registry import Method, Option, StepStats, register
from suite.harness.data import MiniBatch
from suite.harness.device import autocast, place, read_step
from suite.harness.loss_scale import DynamicLossScaler
from suite.harness.optim import LayerwiseOptimizer


@register("grad_accum")
class GradAccum(Method):
    """The whole model on the device; micro-batches run one after another, gradients accumulate."""

    options = {"recompute": Option("off", ("off", "on"), "on: keep only block inputs, recompute in the backward")}
    steady_after = 0  # weights and optimizer state exist when built; gradients are made anew in every step

    def __init__(self, model, run, device):
        super().__init__(model, run, device)
        self.model = place(model, device)
        self.layer_params = [model.layer_named_parameters(i) for i in range(model.num_layers)]
        self.params = [p for named in self.layer_params for _, p in named]
        self.opt = LayerwiseOptimizer(self.layer_params, run)
        self.scaler = DynamicLossScaler(enabled=run.precision == "fp16")
        self.step_count = 0

    def step(self, batch: MiniBatch) -> StepStats:
        for p in self.params:
            p.grad = None
        total = 0.0
        for mb in batch.split(self.run.num_micro_batches):
            ctx = self.model.begin(mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, batch.size)
            with autocast(self.device, self.run.precision):
                loss = self.model.forward_micro_batch(ctx, recompute=self.opts["recompute"] == "on")
            self.scaler.scale_loss(loss).backward()
            total += loss.detach()
        grads = [p.grad for p in self.params if p.grad is not None]
        skipped = False
        if self.scaler.enabled:  # the overflow decides the update: read with the loss, the step's one read-back
            value, skipped = read_step(total, self.scaler.unscale_(grads))
        self.scaler.update(skipped)
        if not skipped:
            if self.run.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.run.clip_grad_norm)
            self.opt.step(self.step_count)
        self.step_count += 1
        if not self.scaler.enabled:  # the one read-back, after the update is queued
            value, _ = read_step(total)
        return StepStats(loss=value, samples=batch.size, skipped=skipped, extra={"loss_scale": self.scaler.scale})

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().cpu().clone() for named in self.layer_params for n, p in named}

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        return {**super().memory_roles(), "optimizer": self.opt.state_tensors()}

    def resident_device_bytes(self) -> int:
        # Weights and optimizer state persist; gradients are freed at each step's start and
        # re-allocated inside it, so the tracker counts them.
        return sum(p.numel() * p.element_size() for p in self.params) + self.opt.state_bytes()
