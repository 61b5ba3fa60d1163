"""The eager param server: FP32 master weights, gradients and optimizer state of every layer in host memory."""

from __future__ import annotations

import time

import torch

from suite.harness.optim import LayerwiseOptimizer


def _host_buffer(numel: int, dtype: torch.dtype, pin: bool, zero: bool = False) -> torch.Tensor:
    # Pinned (page-locked) memory is what lets a non-blocking copy run on a copy engine while the
    # host goes on; pageable memory would be staged through a driver buffer, synchronously.
    make = torch.zeros if zero else torch.empty
    return make(numel, dtype=dtype, pin_memory=pin)


class HostParamServer:
    """Every layer's FP32 master weights as views of one flat host buffer per layer, with its FP32
    gradient buffer and optimizer state beside it, all allocated once; the optimizer steps one
    layer at a time.

    `wire[i]` is what travels to the device: the master itself in FP32, or under CMP a 16-bit copy
    refreshed right after each update (so the device receives half the bytes and converts nothing).
    `landing[i]` is where the device's gradient is copied: the FP32 gradient buffer itself, or under
    CMP a 16-bit buffer that the host widens to FP32 before unscaling. Only wire and landing
    buffers move, so only they are pinned.
    """

    def __init__(self, model, run, wire_dtype: torch.dtype = torch.float32, pin: bool = False, impl: str = "fused"):
        self.run = run
        self.named: list[list[tuple[str, torch.nn.Parameter]]] = []
        self.flat, self.grad_flat, self.wire, self.landing = [], [], [], []
        cmp = wire_dtype != torch.float32
        for i in range(model.num_layers):
            named = model.layer_named_parameters(i)
            numel = sum(p.numel() for _, p in named)
            flat = _host_buffer(numel, torch.float32, pin and not cmp)
            grad = _host_buffer(numel, torch.float32, pin and not cmp, zero=True)
            offset = 0
            for _, p in named:
                n = p.numel()
                flat[offset : offset + n].copy_(p.detach().reshape(-1))
                # The model's own parameters become views of the flat buffer: one copy of the
                # weights, updated in place by the optimizer, readable by HF name.
                p.data = flat[offset : offset + n].view_as(p)
                p.grad = grad[offset : offset + n].view_as(p)
                offset += n
            self.named.append(named)
            self.flat.append(flat)
            self.grad_flat.append(grad)
            self.wire.append(_host_buffer(numel, wire_dtype, pin).copy_(flat) if cmp else flat)
            self.landing.append(_host_buffer(numel, wire_dtype, pin) if cmp else grad)
        self.grads = [[p.grad for _, p in named] for named in self.named]
        self.opt = LayerwiseOptimizer(self.named, run, impl=impl, host=True)  # its state made now, beside the masters
        self.prepare_seconds = 0.0  # host time spent widening, unscaling and taking norms (not waiting for copies)
        self.commit_seconds = 0.0  # host time spent in optimizer updates and refreshing the 16-bit copies

    @property
    def busy_seconds(self) -> float:
        """Host time spent preparing and updating, so far."""
        return self.prepare_seconds + self.commit_seconds

    @property
    def num_layers(self) -> int:
        return len(self.named)

    def prepare(self, layer: int, shipment, scaler, clip: bool):
        """Make layer's gradient ready for its update: wait for it, widen it to FP32, unscale it.

        Returns (found_inf, per-tensor norms): a 1-element tensor, non-zero if any element overflowed
        (None without loss scaling), and the gradient norms the global clipping norm is built from
        (None without clipping). Neither commits anything.
        """
        shipment.host_wait()
        t0 = time.perf_counter()
        if self.landing[layer] is not self.grad_flat[layer]:
            self.grad_flat[layer].copy_(self.landing[layer])
        grads = self.grads[layer]
        found = scaler.unscale_(grads) if scaler.enabled else None
        norms = torch._foreach_norm(grads) if clip else None
        self.prepare_seconds += time.perf_counter() - t0
        return found, norms

    def commit(self, layer: int, step: int, clip_coef: torch.Tensor | None = None) -> None:
        """Apply optimizer step `step` to one layer (gradients scaled by `clip_coef` first), then
        refresh the 16-bit copy the device will load next."""
        t0 = time.perf_counter()
        if clip_coef is not None:
            torch._foreach_mul_(self.grads[layer], clip_coef)
        self.opt.step_layer(layer, step)
        if self.wire[layer] is not self.flat[layer]:
            self.wire[layer].copy_(self.flat[layer])
        self.commit_seconds += time.perf_counter() - t0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for named in self.named for n, p in named}

    def optimizer_state(self) -> list[torch.Tensor]:
        """Every optimizer state tensor (for tests that a skipped step changed nothing)."""
        return self.opt.state_tensors()

    def nbytes(self) -> int:
        """Host bytes held: masters, gradients, 16-bit wire/landing copies and optimizer state."""
        bufs = {id(t): t for ts in (self.flat, self.grad_flat, self.wire, self.landing) for t in ts}
        return sum(t.numel() * t.element_size() for t in bufs.values()) + self.opt.state_bytes()
