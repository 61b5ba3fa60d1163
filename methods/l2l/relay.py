"""The device side of L2L: layer slots that the host's weights relay through, and the boundary-activation stash."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from methods.l2l.lanes import Lanes, Shipment, copy_into, host_buffer, shaped_views, zero


class Slot:
    """A device copy of one layer's structure whose parameters and gradients are views of two flat
    buffers, so that loading a layer is one copy in and shipping its gradient one copy out.

    In FP32 autograd sums the micro-batches' gradients into those views in place. In a 16-bit dtype the sum is
    taken in FP32 instead (`sums`, the relay's one accumulator: one layer is in its backward at a time): each
    micro-batch's gradient arrives in a fresh 16-bit tensor, is added into the accumulator (accumulate()), and the
    sum is rounded once into the 16-bit buffer that ships (round_sums()). Summed in 16 bits, the error at Llama 3
    8B's block grows with the micro-batches: 5.0e-3 of the sum's norm at 16 against 1.7e-3 for one rounding of the
    FP32 sum (measured, issue 63, item 5); AMP and the FP32 references sum in FP32."""

    def __init__(self, template: nn.Module, device: torch.device, dtype: torch.dtype):
        # The structure alone is copied: the template's tensors stay behind (a counted step's fake tensors must
        # not be deep-copied), and each parameter becomes a view of the flat buffers on `device`.
        tensors = [*template.parameters(), *template.buffers()]
        self.module = copy.deepcopy(template, memo={id(t): None for t in tensors})
        params = list(template.parameters())
        numel = sum(p.numel() for p in params)
        self.fp32_sums = dtype != torch.float32  # micro-batches summed in FP32 (accumulate), else by autograd in place
        self.flat = torch.empty(numel, device=device, dtype=dtype)
        self.grad = torch.zeros(numel, device=device, dtype=dtype)
        views, offset = {}, 0
        for p in params:
            n = p.numel()
            # values arrive with the first upload; a preset .grad makes autograd accumulate into it in place,
            # micro-batch after micro-batch
            view = views[id(p)] = nn.Parameter(self.flat[offset : offset + n].view_as(p), p.requires_grad)
            if not self.fp32_sums:
                view.grad = self.grad[offset : offset + n].view_as(p)
            offset += n
        for mine, theirs in zip(self.module.modules(), template.modules()):
            for name, p in theirs._parameters.items():
                mine._parameters[name] = None if p is None else views[id(p)]
            for name, buf in theirs._buffers.items():  # position ids
                mine._buffers[name] = (
                    None if buf is None else buf.to(device, dtype if buf.is_floating_point() else None)
                )
        self.shapes = [p.shape for p in params]
        self.params = [views[id(p)] for p in params]  # in the flat buffers' order
        self.layer: int | None = None  # whose weights the slot holds (None: stale or empty)
        self.loaded = None  # event: the upload of those weights has finished
        self.free = None  # event: the last compute reading the weights has finished
        self.shipment: Shipment | None = None  # the gradient copy still reading self.grad
        self.used = 0  # the relay's tick when the slot last computed (the least recent is refilled first)

    def nbytes(self) -> int:
        return 2 * self.flat.numel() * self.flat.element_size()

    def accumulate(self, sums: torch.Tensor, first: bool) -> None:
        """Add the micro-batch's 16-bit gradients into the FP32 `sums` (the first copies them) and let them go, so
        that the next micro-batch's arrive in fresh tensors. No-op where autograd sums in place (FP32)."""
        if not self.fp32_sums:
            return
        views = shaped_views(sums, self.params)
        got = [(v, p.grad) for v, p in zip(views, self.params) if p.grad is not None]
        if got:
            (torch._foreach_copy_ if first else torch._foreach_add_)(*map(list, zip(*got)))
        missing = [v for v, p in zip(views, self.params) if p.grad is None]
        if first and missing:  # a parameter this micro-batch left without a gradient sums from zero
            torch._foreach_zero_(missing)
        for p in self.params:
            p.grad = None

    def round_sums(self, sums: torch.Tensor) -> None:
        """The FP32 sum over the micro-batches, rounded once into the 16-bit buffer that ships."""
        if self.fp32_sums:
            copy_into(self.grad, sums[: self.grad.numel()])


class DeviceRelay:
    """Slots for the embeddings, the head and the blocks: two alternating block slots by default (blocks share one
    structure), or more (`block_slots`: a device layer cache).

    While one block slot computes layer l, the next layer (l+1 forward, l-1 backward) is uploaded
    into another on the copy stream; the upload waits for the event marking the end of the last
    compute on that slot, and the compute waits for the upload's event. The embeddings and the head
    keep their own slots: their structures differ from a block's and neither depends on depth, so
    device weights stay at embeddings + head + two blocks however deep the model is. A slot keeps
    its tag until its layer is updated, so the blocks last run forward are reused by the backward
    without another upload: with two slots the last two, with as many slots as blocks every one, so that
    each layer crosses the bus once a step (after its update). A layer is uploaded into an empty slot, else
    into the one used longest ago that is not computing.
    """

    def __init__(
        self,
        model,
        wire: list[torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        lanes: Lanes,
        ready,
        trace: list | None = None,
        block_slots: int = 2,
    ):
        self.num_layers = model.num_layers
        self.wire, self.lanes, self.ready, self.trace = wire, lanes, ready, trace  # ready(layer): its update's future
        self.embed = Slot(model.layers[0], device, dtype)
        self.head = Slot(model.layers[-1], device, dtype)
        count = max(2, min(block_slots, self.num_layers - 2))  # more than the blocks would hold nothing
        self.blocks = [Slot(model.layers[1], device, dtype) for _ in range(count)]
        self._tick = 0  # when each block slot was last used (Slot.used), for the choice of the next to fill
        # the FP32 sum of the micro-batches' 16-bit gradients, one layer at a time (Slot.accumulate)
        largest = max(s.flat.numel() for s in (self.embed, self.head, self.blocks[0]))
        self.sums = torch.empty(largest if self.embed.fp32_sums else 0, device=device, dtype=torch.float32)
        for i in range(1, self.num_layers - 1):
            shapes = [p.shape for p in model.layers[i].parameters()]
            if shapes != self.blocks[0].shapes:
                raise ValueError(
                    f"block {i} differs in structure from block 1: L2L relays all blocks through "
                    "two slots of one structure"
                )
        self.current: int | None = None
        self.uploads = 0
        self.skipped_prefetches = 0  # prefetches that found their layer's update unfinished (loaded at use)

    @property
    def slots(self) -> list[Slot]:
        return [self.embed, self.head, *self.blocks]

    def _slot_for(self, layer: int) -> Slot:
        if layer == 0:
            return self.embed
        if layer == self.num_layers - 1:
            return self.head
        for slot in self.blocks:
            if slot.layer == layer:
                return slot
        free = [s for s in self.blocks if s.layer is None or s.layer != self.current]
        return min(free, key=lambda s: (s.layer is not None, s.used))

    def load(self, layer: int, wait: bool = True) -> Slot | None:
        """Start uploading `layer` into a slot unless one holds it already; does not wait for the copy.

        The host copy must hold the layer's latest update first; with wait=False (a prefetch) a
        layer still being updated is left for its use() to load, so that queuing the current
        layer's compute never waits on the host."""
        if not 0 <= layer < self.num_layers:
            return None
        slot = self._slot_for(layer)
        if slot.layer == layer:
            return slot
        update = self.ready(layer)
        if not wait and not update.done():
            self.skipped_prefetches += 1
            return None
        update.result()
        lanes = self.lanes
        with lanes.on(lanes.h2d):
            lanes.wait(slot.free, lanes.h2d)  # no kernel still reads the weights being overwritten
            start = lanes.mark(lanes.h2d) if self.trace is not None else None
            copy_into(slot.flat, self.wire[layer], non_blocking=True)
            lanes.tally("h2d", self.wire[layer])
            slot.loaded = lanes.record(lanes.h2d)
            if start is not None:
                self.trace.append(("upload", layer, start, lanes.mark(lanes.h2d)))
        slot.layer = layer
        self.uploads += 1
        self._tick += 1
        slot.used = self._tick  # just filled: not the next to be refilled before its use
        return slot

    def prefetch(self, layer: int) -> None:
        """Upload `layer` on the copy stream while the current layer computes, if its host copy is ready."""
        self.load(layer, wait=False)

    def use(self, layer: int) -> Slot:
        """The slot holding `layer`, with compute ordered after its upload."""
        slot = self.load(layer)
        self.lanes.wait(slot.loaded)
        self.current = layer
        self._tick += 1
        slot.used = self._tick
        return slot

    def release(self, slot: Slot) -> None:
        """All compute reading `slot` has been queued: a later upload into it waits for this point."""
        slot.free = self.lanes.record()

    def zero_grad(self, slot: Slot) -> None:
        """Clear the slot's gradient buffer for a new layer, after the previous layer's copy has read it."""
        if slot.shipment is not None:
            slot.shipment.device_wait()
            slot.shipment = None
        if not slot.fp32_sums:  # else round_sums writes it whole
            zero(slot.grad)

    def ship(self, slot: Slot, dst: torch.Tensor, group=None, layer: int | None = None) -> Shipment:
        """Send the slot's accumulated gradient to host buffer `dst`, summed over ranks when `group` is set
        (the all-reduce of a layer runs while the device computes the next layer down)."""
        work = dist.all_reduce(slot.grad, group=group, async_op=True) if group is not None else None
        slot.shipment = Shipment(self.lanes, slot.grad, dst, work, traced=self.trace is not None)
        if slot.shipment.start is not None:  # CUDA; on CPU the copy is the host's work, done when it needs it
            self.trace.append(("download", layer, slot.shipment.start, slot.shipment.end))
        return slot.shipment

    def invalidate(self, layer: int) -> None:
        """`layer` was updated on the host: a slot still holding it must upload it again."""
        for slot in self.slots:
            if slot.layer == layer:
                slot.layer = None

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.slots) + self.sums.numel() * self.sums.element_size()


class DeviceGradients:
    """Every layer's gradient (summed over micro-batches and ranks) kept on the device from the end of its backward
    until clipping's norm over all of them is known, each parameter's norm taken as it arrives (in FP32), so that
    the host receives each gradient with the coefficient already decided and applies it as it lands: the host holds
    a ring of landings instead of one a layer (2 bytes a parameter under CMP), the device the gradients in its own
    dtype (Llama 3 8B in bf16: 16 GB beside the slots)."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype, lanes: Lanes):
        self.lanes = lanes
        self.buffers, self.views = [], []
        for i in range(model.num_layers):
            shapes = [p.shape for p in model.layers[i].parameters()]  # the slot's order, and the host's
            flat = torch.empty(sum(s.numel() for s in shapes), device=device, dtype=dtype)
            self.buffers.append(flat)
            views, offset = [], 0
            for shape in shapes:
                views.append(flat[offset : offset + shape.numel()].view(shape))
                offset += shape.numel()
            self.views.append(views)
        self.norms: list[list[torch.Tensor]] = [[] for _ in self.buffers]
        self.shipments: list[Shipment | None] = [None] * len(self.buffers)
        self.held: list = [None] * len(self.buffers)  # per layer: the compute stream's event after its copy

    def hold(self, layer: int, slot: Slot) -> None:
        """Keep the slot's gradient of `layer` (queued behind its backward on the compute stream) and its norms."""
        last = self.shipments[layer]
        if last is not None:  # last step's download of this buffer has read it
            last.device_wait()
            self.shipments[layer] = None
        copy_into(self.buffers[layer], slot.grad)
        self.held[layer] = self.lanes.record()  # the download, issued from the host thread, waits for it
        self.norms[layer] = list(torch._foreach_norm(self.views[layer], 2, dtype=torch.float32))

    def total_norm(self) -> torch.Tensor:
        """The norm of every parameter's norm, stacked in parameter order, as clip_grad_norm_ takes it."""
        return torch.linalg.vector_norm(torch.stack([t for norms in self.norms for t in norms]), 2.0)

    def ship(self, layer: int, dst: torch.Tensor) -> Shipment:
        """Copy the held gradient of `layer` down to host buffer `dst` (no other copy is queued on it meanwhile)."""
        self.shipments[layer] = Shipment(self.lanes, self.buffers[layer], dst, produced=self.held[layer])
        return self.shipments[layer]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


class Stash:
    """Each block's input per micro-batch, kept on the device (stash=gpu) or in pinned host memory (stash=cpu).

    Offloading copies each activation down on the device-to-host stream right after it is produced
    (`keep` stops the allocator reusing it before the copy has read it); the backward brings a
    layer's activations back on the host-to-device stream one layer ahead of their use. Reusing a
    host buffer waits for the event of its last upload, so that the next step's offload cannot
    overwrite it early.
    """

    def __init__(self, lanes: Lanes, device: torch.device, offload: bool, pin: bool, trace: list | None = None):
        self.lanes, self.device, self.offload, self.pin, self.trace = lanes, device, offload, pin, trace
        self.host: dict[tuple[int, int], torch.Tensor] = {}  # flat, as large as the largest input seen
        self.views: dict[tuple[int, int], torch.Tensor] = {}  # the part of it the current step uses
        self.downloaded: dict[tuple[int, int], object] = {}
        self.uploaded: dict[tuple[int, int], object] = {}
        self.on_device: dict[tuple[int, int], tuple[torch.Tensor, object]] = {}

    def put(self, layer: int, mb: int, x: torch.Tensor) -> None:
        key = (layer, mb)
        if not self.offload:
            self.on_device[key] = (x, None)
            return
        buf = self._buffer(key, x)
        lanes = self.lanes
        produced = lanes.record()
        with lanes.on(lanes.d2h):
            lanes.wait(produced, lanes.d2h)
            lanes.wait(self.uploaded.pop(key, None), lanes.d2h)
            start = lanes.mark(lanes.d2h) if self.trace is not None else None
            copy_into(buf, x, non_blocking=True)
            lanes.tally("d2h", x)
            lanes.keep(x, lanes.d2h)
            self.downloaded[key] = lanes.record(lanes.d2h)
            if start is not None:
                self.trace.append(("stash-down", layer, start, lanes.mark(lanes.d2h)))

    def _buffer(self, key: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
        """The host buffer for `key`, shaped like `x`: one flat pinned allocation per key, grown when a
        batch is longer than any before (fine-tuning trims each batch), viewed as x's shape. The view
        is kept while the shape repeats, so that steady-state steps create no tensors on the host."""
        flat = self.host.get(key)
        if flat is None or flat.numel() < x.numel() or flat.dtype != x.dtype:
            last = self.uploaded.get(key)  # the last copy from the buffer let go here must have read it
            if flat is not None and last is not None:
                last.synchronize()
            flat = self.host[key] = host_buffer(x.numel(), x.dtype, self.pin)
            self.views.pop(key, None)
        view = self.views.get(key)
        if view is None or view.shape != x.shape:
            view = self.views[key] = flat[: x.numel()].view(x.shape)
        return view

    def prefetch(self, layer: int, num_micro_batches: int) -> None:
        """Start bringing `layer`'s stashed inputs back to the device (no-op when they never left)."""
        if not self.offload or layer < 1:
            return
        lanes = self.lanes
        for mb in range(num_micro_batches):
            key = (layer, mb)
            buf = self.views[key]
            with lanes.on(lanes.h2d):
                lanes.wait(self.downloaded.pop(key, None), lanes.h2d)
                x = torch.empty(buf.shape, dtype=buf.dtype, device=self.device)  # a real device copy, also on CPU
                start = lanes.mark(lanes.h2d) if self.trace is not None else None
                copy_into(x, buf, non_blocking=True)
                lanes.tally("h2d", buf)
                event = self.uploaded[key] = lanes.record(lanes.h2d)
                if start is not None:
                    self.trace.append(("stash-up", layer, start, lanes.mark(lanes.h2d)))
            self.on_device[key] = (x, event)

    def take(self, layer: int, mb: int) -> torch.Tensor:
        """The stashed input, ready for compute; the stash lets go of it."""
        x, event = self.on_device.pop((layer, mb))
        if event is not None:
            self.lanes.wait(event)
            self.lanes.keep(x, self.lanes.compute)  # allocated on the copy stream, freed after compute uses it
        return x

    def clear(self) -> None:
        self.on_device.clear()

    def tensors(self) -> list[torch.Tensor]:
        """Everything the stash holds now: host buffers and the activations on (or bound for) the device."""
        return [*self.host.values(), *(x for x, _ in self.on_device.values())]
