"""The eager param server: FP32 master weights and optimizer state of every layer in host memory, and where each
layer's gradient lands from the device."""

from __future__ import annotations

import time

import torch

from methods.l2l.lanes import host_buffer, shaped_views
from suite.harness import host_commit
from suite.harness.device import is_fake
from suite.harness.optim import WINDOW_ALIGN, LayerwiseOptimizer

# Elements of the FP32 window a 16-bit gradient applied as it lands is widened into (4 MiB); cut at multiples of
# WINDOW_ALIGN from each parameter's start, as LayerwiseOptimizer.step_window needs
WINDOW = 256 * WINDOW_ALIGN


def cut_windows(params: list[torch.nn.Parameter], size: int) -> list[tuple[int, int, list[tuple]]]:
    """A layer's parameters cut into windows of at most `size` elements over its flat buffer, each window
    (lo, hi, pieces), a piece (param, start, stop, at): elements start:stop of the flattened param, at `at` in the
    flat buffer. Each parameter is cut at multiples of `size` from its own start (a multiple of WINDOW_ALIGN, as
    step_window needs); small ones share a window."""
    out, pieces, lo, at = [], [], 0, 0
    for p in params:
        for a in range(0, p.numel(), size):
            b = min(p.numel(), a + size)
            if at + a + (b - a) - lo > size:
                out.append((lo, at + a, pieces))
                pieces, lo = [], at + a
            pieces.append((p, a, b, at + a))
        at += p.numel()
    if pieces:
        out.append((lo, at, pieces))
    return out


def step_windows(opt, layer: int, step: int, windows, landing, flat, wire, scratch, clip_coef=None) -> None:
    """Optimizer step `step` of one layer a window at a time (`windows`: cut_windows of its parameters): each window's
    16-bit gradient (from `landing`) widened into `scratch` (and multiplied by `clip_coef`), the window stepped, its
    16-bit copy (`wire`, of the FP32 `flat`) refreshed while it is in cache."""
    opt.begin_windows(layer, step)
    for lo, hi, pieces in windows:
        grad = scratch[: hi - lo]
        grad.copy_(landing[lo:hi])
        if clip_coef is not None:
            grad.mul_(clip_coef)
        opt.step_window(layer, [(p, a, b, grad[at - lo : at - lo + b - a]) for p, a, b, at in pieces])
        wire[lo:hi].copy_(flat[lo:hi])


class HostParamServer:
    """Every layer's FP32 master weights as views of one flat host buffer per layer, with its optimizer state
    beside it, all allocated once; the optimizer steps one layer at a time.

    `wire[i]` is what travels to the device: the master itself in FP32, or under CMP a 16-bit copy refreshed right
    after each update (so the device receives half the bytes and converts nothing). `landing_for(i)` is where the
    device's gradient is copied, in the wire's dtype. Only wire and landing buffers move, so only they are pinned.

    Where the gradients land:
    - held (`ring=None`): one landing buffer per layer, kept until the layer's commit. A global gate (fp16's
      overflow check, clipping's norm over every layer) or an update after the whole backward needs every layer's
      gradient before the first commit.
    - a ring of `ring` buffers as large as the largest layer, reused in turn as the gradients ship: the host applies
      each layer's gradient as it lands (overlap=on, no host gate), so no gradient outlives its commit. The
      backward ships head first (`forward=False`): layer i lands in buffer (n - 1 - i) % ring, once the update of
      layer i + ring (its last user) has finished: the caller waits for it (`reuses`). Gradients held on the device
      until clipping's norm is known ship embeddings first (`forward=True`): layer i in buffer i % ring, after
      layer i - ring's update.

    The optimizer reads FP32 gradients: in FP32 the landing itself (each parameter's `.grad`); under CMP the 16-bit
    landing, widened.
    - Applied as it lands (a ring) with torch's fused AdamW: in one pass where the host's native kernel gives
      torch's bits (suite/harness/host_commit.py): each element's 16-bit gradient read, AdamW applied, its 16-bit
      copy written, in one parallel region a layer of `threads` threads. Elsewhere through a scratch of WINDOW
      elements: each layer's commit widens its gradient a window at a time, steps that window (AdamW is
      elementwise: the same bits as one call over the layer, LayerwiseOptimizer.step_window) and refreshes the
      window's 16-bit copy while it is in cache.
    - Otherwise (LAMB's per-tensor trust ratio, a gate's norms and overflow flags over the whole layer): a scratch
      as large as the largest layer, as each parameter's `.grad`. A layer's gradient is widened and unscaled into
      it when it is prepared, and again at its commit where the scratch has since held another layer (a gated
      step): the same values both times.
    So the host holds no FP32 gradient a parameter: under CMP, 4 (master) + 8 (moments) + 2 (wire) bytes a
    parameter, plus 2 for held landings.
    """

    def __init__(
        self,
        model,
        run,
        wire_dtype: torch.dtype = torch.float32,
        pin: bool = False,
        impl: str = "fused",
        ring: int | None = None,
        device_type: str = "cpu",
        forward: bool = False,
        flat_state: bool = False,
    ):
        self.run = run
        self.forward = forward  # the ring is filled embeddings first (else head first)
        self.threads = host_commit.team(device_type)  # the one-pass commit's team (a GPU's host leaves two cores)
        self.named: list[list[tuple[str, torch.nn.Parameter]]] = []
        self.flat, self.wire = [], []
        self.cmp = wire_dtype != torch.float32
        sizes = [sum(p.numel() for _, p in model.layer_named_parameters(i)) for i in range(model.num_layers)]
        n, largest = len(sizes), max(sizes)
        self.ring = ring if ring is not None and ring < n else None
        for i, numel in enumerate(sizes):
            named = model.layer_named_parameters(i)
            flat = host_buffer(numel, torch.float32, pin and (flat_state or not self.cmp))
            for (_, p), view in zip(named, shaped_views(flat, [p for _, p in named])):
                view.copy_(p.detach())
                # The model's own parameters become views of the flat buffer: one copy of the
                # weights, updated in place by the optimizer, readable by HF name.
                p.data = view
            self.named.append(named)
            self.flat.append(flat)
            self.wire.append(host_buffer(numel, wire_dtype, pin).copy_(flat) if self.cmp else flat)
        # FP32 landings start at zero (the optimizer reads them as gradients before any has landed, e.g. a count's
        # first step); 16-bit ones are always written before they are read.
        zero = not self.cmp
        if flat_state:  # updated on the device: no gradient comes to the host
            self.landing = []
        elif self.ring is None:
            self.landing = [host_buffer(numel, wire_dtype, pin, zero) for numel in sizes]
        else:
            self.landing = [host_buffer(largest, wire_dtype, pin, zero) for _ in range(self.ring)]
        self.opt = LayerwiseOptimizer(self.named, run, impl=impl, host=True)  # its state made now, beside the masters
        # Where the update runs on the device (methods/l2l/device_update.py): each layer's moments as views of two
        # flat buffers, pinned with its master, so that the three cross the link as one copy each
        self._state_flats = [self._flatten_state(i, pin) for i in range(n)] if flat_state else []
        self.windowed = self.cmp and self.ring is not None and all(self.opt.windowable(i) for i in range(n))
        scratch = min(WINDOW, largest) if self.windowed else largest
        self.scratch = host_buffer(scratch, torch.float32, False, zero=True) if self.cmp and not flat_state else None
        # Each layer's FP32 gradients, as its parameters' .grad: views of its landing, or of the scratch (CMP, where
        # it holds a whole layer); none where none comes to the host
        self.grads = []
        for i, named in enumerate(self.named):
            params = [p for _, p in named]
            source = self.scratch if self.cmp else None if flat_state else self._landing_flat(i)
            self.grads.append([] if self.windowed or source is None else shaped_views(source, params))
            for p, g in zip(params, self.grads[i]):
                p.grad = g
        self._windows = [cut_windows([p for _, p in named], WINDOW) for named in self.named] if self.windowed else []
        if self.windowed and not is_fake(self.flat[0]):
            host_commit.kernel()  # built and probed now, on this thread, not inside the first step's host work
        # each layer's wire copy as its parameters' views (the one-pass commit writes them)
        self._wire_views = [shaped_views(w, [p for _, p in named]) for w, named in zip(self.wire, self.named)]
        self._in_scratch: int | None = None  # the layer whose gradient the scratch holds, unscaled
        self._scaled_by = [1.0] * n  # each layer's loss scale when it was prepared (the step updates it after)
        # host time spent widening, unscaling and taking norms (not waiting for copies); a windowed commit widens
        # its own windows, in commit_seconds
        self.prepare_seconds = 0.0
        self.commit_seconds = 0.0  # host time spent in optimizer updates and refreshing the 16-bit copies

    def _flatten_state(self, layer: int, pin: bool) -> tuple[torch.Tensor, ...]:
        params = [p for _, p in self.named[layer]]
        numel = self.flat[layer].numel()
        flats = [host_buffer(numel, torch.float32, pin, zero=True) for _ in range(2)]
        opt = self.opt.opts[layer]
        for key, flat in zip(("exp_avg", "exp_avg_sq"), flats):
            for p, view in zip(params, shaped_views(flat, params)):
                view.copy_(opt.state[p][key])
                opt.state[p][key] = view
        return (self.flat[layer], *flats)

    def state_flats(self, layer: int) -> tuple[torch.Tensor, ...]:
        """Layer's FP32 master and two moments as three flat host buffers (flat_state only)."""
        return self._state_flats[layer]

    @property
    def busy_seconds(self) -> float:
        """Host time spent preparing and updating, so far."""
        return self.prepare_seconds + self.commit_seconds

    @property
    def num_layers(self) -> int:
        return len(self.named)

    def _position(self, layer: int) -> int:
        """Where `layer` comes in the order its gradient ships."""
        return layer if self.forward else self.num_layers - 1 - layer

    def _landing_flat(self, layer: int) -> torch.Tensor:
        if self.ring is None:
            return self.landing[layer]
        return self.landing[self._position(layer) % self.ring]

    def landing_for(self, layer: int) -> torch.Tensor:
        """The host buffer `layer`'s gradient is copied into (its first numel elements of a ring buffer)."""
        return self._landing_flat(layer)[: self.flat[layer].numel()]

    def reuses(self, layer: int) -> int | None:
        """The layer whose landing `layer`'s gradient overwrites (its update must have finished first), if any."""
        if self.ring is None or self._position(layer) < self.ring:
            return None
        return layer - self.ring if self.forward else layer + self.ring

    def _load(self, layer: int, scaler, scale: float | None = None) -> torch.Tensor | None:
        """Under CMP: widen the layer's landed 16-bit gradient into the FP32 scratch. Then unscale it (by `scale`, or
        the scaler's own). Returns the overflow flag (None without loss scaling)."""
        grads = self.grads[layer]
        if self.cmp:
            self.scratch[: self.flat[layer].numel()].copy_(self.landing_for(layer))
            self._in_scratch = layer
        return scaler.unscale_(grads, scale) if scaler.enabled else None

    def prepare(self, layer: int, shipment, scaler, clip: bool):
        """Make layer's gradient ready for its update: wait for it, widen it to FP32, unscale it.

        Returns (found_inf, per-tensor norms): a 1-element tensor, non-zero if any element overflowed
        (None without loss scaling), and the gradient norms the global clipping norm is built from
        (None without clipping). Neither commits anything.
        """
        shipment.host_wait()
        if self.windowed:  # ungated: nothing to check, and the commit widens it a window at a time
            return None, None
        t0 = time.perf_counter()
        self._scaled_by[layer] = scaler.scale
        found = self._load(layer, scaler)
        norms = torch._foreach_norm(self.grads[layer]) if clip else None
        self.prepare_seconds += time.perf_counter() - t0
        return found, norms

    def commit(self, layer: int, step: int, scaler, clip_coef: torch.Tensor | None = None) -> None:
        """Apply optimizer step `step` to one layer (gradients scaled by `clip_coef` first), then
        refresh the 16-bit copy the device will load next."""
        t0 = time.perf_counter()
        if self.windowed:  # applied as it lands: no host gate (HostUpdater refuses one with a ring)
            assert not scaler.enabled, "a windowed commit has no overflow gate"
            landing, flat, wire = self.landing_for(layer), self.flat[layer], self.wire[layer]
            # a counted step's fake tensors have no data for the kernel: the windowed path allocates what it does
            module = None if is_fake(flat) else host_commit.kernel()
            if module is not None:
                # clipping's coefficient (decided on the device before anything shipped): a float32, as the gate's
                mul = 1.0 if clip_coef is None else float(clip_coef.float())
                params = [p for _, p in self.named[layer]]
                halves = {
                    id(p): pair for p, pair in zip(params, zip(shaped_views(landing, params), self._wire_views[layer]))
                }
                self.opt.step_16bit(layer, step, module, halves, mul, self.threads)
            else:
                step_windows(self.opt, layer, step, self._windows[layer], landing, flat, wire, self.scratch, clip_coef)
            self.commit_seconds += time.perf_counter() - t0
            return
        if self.cmp and self._in_scratch != layer:  # a gated step prepared other layers since: the same values again
            self._load(layer, scaler, self._scaled_by[layer])  # (the scale may have grown since: not by this one)
        if clip_coef is not None:
            torch._foreach_mul_(self.grads[layer], clip_coef)
        self.opt.step_layer(layer, step)
        self._in_scratch = None  # clipped and stepped: no longer the prepared gradient
        if self.wire[layer] is not self.flat[layer]:
            self.wire[layer].copy_(self.flat[layer])
        self.commit_seconds += time.perf_counter() - t0

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for named in self.named for n, p in named}

    def optimizer_state(self) -> list[torch.Tensor]:
        """Every optimizer state tensor (for tests that a skipped step changed nothing)."""
        return self.opt.state_tensors()

    def gradient_buffers(self) -> list[torch.Tensor]:
        """Every host buffer a gradient passes through: the landings and, under CMP, the FP32 scratch."""
        return [*self.landing, *([self.scratch] if self.scratch is not None else [])]

    def nbytes(self) -> int:
        """Host bytes held: masters, 16-bit wire copies, landings, the scratch and optimizer state."""
        bufs = {id(t): t for ts in (self.flat, self.wire, self.gradient_buffers()) for t in ts}
        return sum(t.numel() * t.element_size() for t in bufs.values()) + self.opt.state_bytes()
