"""L2L's update on the device (`update=device`, issue 63, item 3): each layer's FP32 master and AdamW moments come up
from the host while its backward runs, the update runs in device memory once its gradient is summed, and the
master, the moments and the copy the next forward loads go back down; the host only holds them.

Where the host's memory streams faster through the copy engines than through its cores' update (the roofline,
methods/roofline.py, prices both per machine kind), this moves the host's 28 bytes a parameter of update traffic to
the link: 12 up and 12 + the wire's back, both directions overlapping the device's compute. The gradient never
leaves the device: the update reads the slot's FP32 sum of the micro-batches (CMP) or its FP32 gradient (L2L).

Two sets of device buffers, each as large as the largest layer's master and moments (12 bytes a parameter), take
turns: while one layer updates, the next layer down brings its state up into the other. A set is refilled only
after its last download has read it."""

from __future__ import annotations

import torch

from methods.l2l.lanes import Shipment, copy_into, shaped_views
from methods.l2l.updates import _done
from suite.harness.adamw import fused_adamw, group_hyper


class DeviceUpdate:
    """Stream each layer's master and moments through the device and update them there (see the module)."""

    def __init__(self, server, lanes, device: torch.device, pool):
        self.server, self.lanes, self.pool = server, lanes, pool
        opt = server.opt
        if not all(opt.windowable(i) for i in range(server.num_layers)):
            raise ValueError("update=device runs torch's fused AdamW on the device: optimizer=adamw")
        largest = max(f.numel() for f in server.flat)
        # per set: the master, first and second moments, one flat buffer each
        self.sets = [[torch.empty(largest, device=device) for _ in range(3)] for _ in range(2)]
        self.loaded: list = [None, None]  # per set: (layer, the event its upload recorded)
        self.freed: list = [None, None]  # per set: the event of its last download
        self.steps = [torch.zeros((), device=device) for _ in range(2)]  # the step count AdamW reads, per set
        n = server.num_layers
        self.ready = [_done() for _ in range(n)]  # per layer: its state and 16-bit copy are back on the host
        self.counts = [0] * n  # per layer: the updates applied (AdamW's step count)

    def _set(self, layer: int) -> int:
        return layer % 2

    def fetch(self, layer: int) -> None:
        """Bring `layer`'s master and moments up on the copy stream (its backward is about to run)."""
        if layer < 0:
            return
        k, lanes, server = self._set(layer), self.lanes, self.server
        if self.loaded[k] is not None and self.loaded[k][0] == layer:
            return
        numel = server.flat[layer].numel()
        with lanes.on(lanes.h2d):
            lanes.wait(self.freed[k], lanes.h2d)  # the set's last download has read it
            for dst, src in zip(self.sets[k], server.state_flats(layer)):
                copy_into(dst[:numel], src, non_blocking=True)
                lanes.tally("h2d", src)
            self.loaded[k] = (layer, lanes.record(lanes.h2d))

    def apply(self, layer: int, slot, grads: list[torch.Tensor], step: int) -> None:
        """Optimizer step `step` of `layer` on the device from its FP32 gradients `grads` (one a parameter, in the
        slot's order), the slot's weights made the updated ones, and master, moments and wire copy sent down."""
        self.fetch(layer)  # where its fetch was not issued ahead
        k, lanes, server = self._set(layer), self.lanes, self.server
        lanes.wait(self.loaded[k][1])
        numel = server.flat[layer].numel()
        master, m, v = (b[:numel] for b in self.sets[k])
        params = [p for _, p in server.named[layer]]
        master_v, m_v, v_v = (shaped_views(t, params) for t in (master, m, v))
        opt = server.opt.opts[layer]
        server.opt.begin_windows(layer, step)  # its LR set, its host step counts advanced
        self.counts[layer] += 1
        index = {id(p): i for i, p in enumerate(params)}
        for g in opt.param_groups:
            mine = [index[id(p)] for p in g["params"]]
            if not mine:
                continue
            count = self.steps[k]
            count.fill_(float(self.counts[layer]))  # as the host's step counts hold it (no data read back)
            fused_adamw(
                [master_v[i] for i in mine],
                [grads[i] for i in mine],
                [m_v[i] for i in mine],
                [v_v[i] for i in mine],
                [count] * len(mine),
                **{**group_hyper(g), "maximize": False},
            )
        copy_into(slot.flat, master)  # the slot holds the updated layer (rounded to the wire's dtype)
        # down: the master, the moments and the wire copy the next forward uploads
        downs = [Shipment(lanes, src, dst) for src, dst in zip((master, m, v), server.state_flats(layer))]
        if server.wire[layer] is not server.flat[layer]:
            downs.append(Shipment(lanes, slot.flat, server.wire[layer]))
        self.loaded[k] = None
        if not lanes.cuda:  # on a CPU each copy is made when waited for: now, before the set is refilled
            _wait_all(downs)
            self.ready[layer] = _done()
            return
        # the d2h stream runs in order: its last copy's event marks all of them; the slot's weights are read by the
        # wire's copy, so no upload may overwrite them before it (the relay's uploads wait for slot.free)
        self.freed[k] = slot.free = downs[-1].event
        self.ready[layer] = self.pool.submit(_wait_all, downs, layer=layer, landed=downs[-1].landed)

    def tensors(self) -> list[torch.Tensor]:
        """The device buffers the state passes through (both sets) and their step counts."""
        return [t for s in self.sets for t in s] + self.steps

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def _wait_all(downs) -> None:
    for d in downs:
        d.host_wait()
