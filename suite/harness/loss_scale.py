"""Dynamic loss scaling for fp16: overflow is detected before any update is committed."""

from __future__ import annotations

import torch


class DynamicLossScaler:
    """Scale the loss up, unscale the gradients, skip the step on inf/NaN and back off; grow when stable.

    Unlike one torch GradScaler per optimizer, the overflow check spans all gradients of the step,
    so a per-layer optimizer never commits part of a step that overflowed elsewhere.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ):
        self.scale = init_scale if enabled else 1.0
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.enabled = growth_interval, enabled
        self._good_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, grads: list[torch.Tensor], scale: float | None = None) -> torch.Tensor:
        """Divide grads by the scale (the current one, or `scale`: the one their loss was scaled by, where the step
        has since updated it) in place; returns a 1-element tensor, non-zero if any was inf/NaN."""
        device = grads[0].device if grads else torch.device("cpu")
        found = torch.zeros(1, device=device)
        if not self.enabled or not grads:
            return found
        inv = torch.full((1,), 1.0 / (self.scale if scale is None else scale), device=device)
        by_dev: dict[tuple, list[torch.Tensor]] = {}
        for g in grads:
            by_dev.setdefault((g.device, g.dtype), []).append(g)
        for (dev, _), gs in by_dev.items():
            f = torch.zeros(1, device=dev)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, f, inv.to(dev))
            found += f.to(device)
        return found

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow; grow after `growth_interval` clean steps."""
        if not self.enabled:
            return
        if found_inf:
            self.scale *= self.backoff_factor
            self._good_steps = 0
        else:
            self._good_steps += 1
            if self._good_steps % self.growth_interval == 0:
                self.scale *= self.growth_factor
