"""AMP: gradient accumulation under torch.autocast, fp16 with dynamic loss scaling or bf16."""

from __future__ import annotations

from baselines.grad_accum import GradAccum
from suite.core.registry import register


@register("amp")
class AMP(GradAccum):
    """FP32 master weights on the device, 16-bit compute under autocast; fp16 scales the loss."""

    precisions = ("fp16", "bf16")
