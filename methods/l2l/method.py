"""The registered L2L methods: `l2l` (FP32 relay) and `l2l-cmp` (cross mixed precision: 16-bit device, FP32 host)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from methods.l2l.device_update import DeviceUpdate
from methods.l2l.lanes import Lanes, shaped_views
from methods.l2l.param_server import HostParamServer
from methods.l2l.relay import DeviceGradients, DeviceRelay, Stash
from methods.l2l.timeline import breakdown
from methods.l2l.updates import HostUpdater
from suite.config.errors import ConfigError
from suite.core.registry import Method, Option, StepStats, register
from suite.harness.data import MiniBatch
from suite.harness.device import DTYPES, scalar
from suite.harness.loss_scale import DynamicLossScaler
from suite.harness.optim import IMPLS


def _process_group(run, device: torch.device):
    """The default group of `run.ranks` processes (joined from torchrun's env if needed); None for one rank."""
    if run.ranks == 1:
        return None
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds each rank to the current device
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != run.ranks:
        raise ConfigError(f"ranks={run.ranks} but torch.distributed has {dist.get_world_size()} processes")
    return dist.group.WORLD


@register("l2l")
class L2L(Method):
    """Layer-to-layer: host param server, two device slots, every micro-batch through a layer before the next.

    Device memory, independent of depth except for the stash: four slots (embeddings, head, two
    blocks; more blocks with block_slots) with their gradient buffers; per micro-batch one incoming
    activation gradient; the recompute of one layer for one micro-batch; and the stash, one block
    input per block and micro-batch on the device (stash=gpu) or, with stash=cpu, only the inputs
    of the layer being computed and of the one being prefetched.
    """

    precisions = ("fp32",)
    hosts_state = True
    steady_after = 0  # slots, param server and optimizer state are made when built (tests/test_counting.py)
    dist_check_module = "methods.l2l.dist_check"
    options = {
        "stash": Option("gpu", ("gpu", "cpu"), "where boundary activations wait for the backward"),
        "overlap": Option("off", ("off", "on"), "on: update layer l on the host during layer l-1's backward (L2Lp)"),
        "host_optim": Option(
            "fused", IMPLS, "the host update's kernels: fused (torch's fused AdamW, the suite's fused LAMB) or foreach"
        ),
        "block_slots": Option(
            2,
            help="device slots for blocks: 2 (one computes while the next uploads) or more, a device layer cache "
            "(each slot a block's 16-bit or FP32 weights and gradient buffer); as many as the blocks keeps each on "
            "the device between its updates, so that a layer crosses the bus once a step",
        ),
        "landing": Option(
            "ring",
            ("ring", "held"),
            "where gradients wait for the host: ring (three layers' buffers, each gradient applied as it lands, where "
            "overlap=on and no gate holds the step; else held) or held (a buffer a layer: the device may run ahead "
            "of a slow host, for 2 or 4 more host bytes a parameter)",
        ),
        "update": Option(
            "host",
            ("host", "device"),
            "where AdamW updates each layer: host (the param server's cores) or device (its FP32 master and moments "
            "brought up during its backward, updated in device memory and sent back with the 16-bit copy: 12 + 14 "
            "bytes a parameter over the link, none of the host's cores; overlap=on, adamw, no gate)",
        ),
    }

    @classmethod
    def check_config(cls, run) -> None:
        super().check_config(run)
        opts = cls.resolved_options(run)
        slots = opts["block_slots"]
        if slots < 2:
            raise ConfigError(f"block_slots={slots}: the relay needs 2 or more (one computes while the next uploads)")
        if opts["update"] == "device":
            why = [
                what
                for what, bad in (
                    ("overlap=on", opts["overlap"] != "on"),
                    ("optimizer=adamw", run.optimizer != "adamw"),
                    ("no fp16 loss scaling", run.precision == "fp16"),
                    ("clip_grad_norm=0", run.clip_grad_norm > 0),
                    ("ranks=1", run.ranks != 1),
                    ("host_optim=fused", opts["host_optim"] != "fused"),
                )
                if bad
            ]
            if why:
                raise ConfigError(f"update=device needs {', '.join(why)} (it updates each layer as its backward ends)")

    @classmethod
    def recomputes(cls, run) -> bool:
        """Always: the backward recomputes every block's forward from its stash (its hardware FLOPs count it)."""
        return True

    def __init__(self, model, run, device, trace: list | None = None):
        super().__init__(model, run, device)
        self.group = _process_group(run, device)
        self.world = run.ranks
        self.dtype = DTYPES[run.precision]
        pin = device.type == "cuda"
        overlap = self.opts["overlap"] == "on"
        ring = HostUpdater.ring(run, overlap) if self.opts["landing"] == "ring" else None
        if ring is not None and ring >= model.num_layers:  # as many buffers as layers: a landing a layer, no ring
            ring = None
        held = ring is not None and HostUpdater.clips_on_device(run, overlap)  # clipping's norm taken on the device
        on_device = self.opts["update"] == "device"
        self.server = HostParamServer(
            model,
            run,
            self.dtype,
            pin,
            impl=self.opts["host_optim"],
            ring=ring,
            device_type=device.type,
            forward=held,
            flat_state=on_device,
        )
        self.scaler = DynamicLossScaler(enabled=run.precision == "fp16")
        # Every step is traced (marks cost microseconds): the spans of the last one, for timeline()
        self.trace = trace if trace is not None else []
        self.lanes = Lanes(device)
        self.held = DeviceGradients(model, device, self.dtype, self.lanes) if held else None
        self.updater = HostUpdater(
            self.server,
            self.scaler,
            run,
            overlap,
            invalidate=lambda layer: self.relay.invalidate(layer),
            held=self.held,
        )
        # the update on the device (methods/l2l/device_update.py), its downloads waited for on the host thread
        self.device_update = DeviceUpdate(self.server, self.lanes, device, self.updater.pool) if on_device else None
        self.relay = DeviceRelay(
            model,
            self.server.wire,
            device,
            self.dtype,
            self.lanes,
            lambda layer: (self.device_update or self.updater).ready[layer],
            self.trace,
            self.opts["block_slots"],
        )
        self.stash = Stash(self.lanes, device, self.opts["stash"] == "cpu", pin, self.trace)
        self.step_count = 0
        self._marks = None  # (start, end) of the last step on the trace's time base
        self._host = (0.0, 0.0, 0)  # prepare s, commit s, skipped prefetches as of the last timeline()
        self._moved = {"h2d": 0, "d2h": 0}  # the copies' tally (Lanes.moved) when the last step began

    @contextlib.contextmanager
    def _span(self, kind: str, layer: int):
        """Marks around one layer's compute: events of the compute stream (CUDA) or the host clock (CPU)."""
        start = self.lanes.mark()
        yield
        self.trace.append((kind, layer, start, self.lanes.mark()))

    def _ship(self, layer: int, slot) -> None:
        self.relay.release(slot)
        if self.device_update is not None:  # updated where it is: FP32 sums (CMP) or the FP32 gradient (L2L)
            grads = shaped_views(self.relay.sums, slot.params) if slot.fp32_sums else [p.grad for p in slot.params]
            self.device_update.apply(layer, slot, grads, self.step_count)
            return
        if self.held is not None:  # kept on the device until clipping's norm is known (finish() ships it)
            if self.group is not None:
                dist.all_reduce(slot.grad, group=self.group)
            self.held.hold(layer, slot)
            return
        shipment = self.relay.ship(slot, self.updater.landing(layer), self.group, layer)
        self.updater.layer_done(layer, shipment, self.step_count)

    def _fetch_state(self, layer: int) -> None:
        """With the update on the device: bring `layer`'s master and moments up while its backward runs."""
        if self.device_update is not None:
            self.device_update.fetch(layer)

    def step(self, batch: MiniBatch) -> StepStats:
        model, relay, stash = self.model, self.relay, self.stash
        head = model.num_layers - 1
        # Each rank holds its shard; dividing by the global minibatch makes the ranks' sum the
        # single-rank gradient.
        denom = batch.size * self.world
        self.trace.clear()
        self._moved = dict(self.lanes.moved)  # the copies counted from here are this step's
        start = self.lanes.mark()
        ctxs = [
            model.begin(mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, denom)
            for mb in batch.split(self.run.num_micro_batches)
        ]
        n = len(ctxs)

        # Forward (Algorithm 2's inverted loop): every micro-batch passes a layer before the next is used.
        acts = [None] * n
        with torch.no_grad():
            for layer in range(head):
                slot = relay.use(layer)
                relay.prefetch(layer + 1)  # the next layer's upload runs beside this layer's compute
                with self._span("forward", layer):
                    for u, ctx in enumerate(ctxs):
                        acts[u] = model.forward_layer(layer, acts[u], ctx, module=slot.module)
                        if layer + 1 < head:  # the last block's output goes straight into the head
                            stash.put(layer + 1, u, acts[u])
                relay.release(slot)

        # The head runs forward and backward at once: its loss is the last forward and the first backward.
        slot = relay.use(head)
        relay.zero_grad(slot)
        relay.prefetch(head - 1)
        self._fetch_state(head)  # behind the weights the next layer needs first, on the same copy stream
        stash.prefetch(head - 1, n)
        grads, total = [None] * n, 0.0
        with self._span("backward", head):
            for u, ctx in enumerate(ctxs):
                x = acts[u].detach().requires_grad_()
                acts[u] = None
                with torch.enable_grad():
                    loss = model.forward_layer(head, x, ctx, module=slot.module)
                self.scaler.scale_loss(loss).backward()
                slot.accumulate(relay.sums, u == 0)
                grads[u] = x.grad
                total += loss.detach()
        if self.device_update is None:  # the update on the device reads the FP32 sums themselves
            slot.round_sums(relay.sums)
        self._ship(head, slot)
        # Every rank reports the global minibatch loss; the sum is collected while the backward runs.
        loss_sum = dist.all_reduce(total, group=self.group, async_op=True) if self.group is not None else None

        # Backward, head to embeddings: recompute each layer from its stash under the same keys,
        # accumulate its parameter gradient over all micro-batches, pass the input gradient down.
        for layer in range(head - 1, -1, -1):
            slot = relay.use(layer)
            relay.zero_grad(slot)
            relay.prefetch(layer - 1)  # the layer below uploads while this one computes
            self._fetch_state(layer)
            stash.prefetch(layer - 1, n)
            with self._span("backward", layer):
                for u, ctx in enumerate(ctxs):
                    # The graph is built here and freed by backward(): nothing outlives the layer,
                    # so no graph keeps a slot's weights alive across its next upload.
                    x = stash.take(layer, u).detach().requires_grad_() if layer else None
                    with torch.enable_grad():
                        y = model.forward_layer(layer, x, ctx, module=slot.module)
                    y.backward(grads[u])  # parameter gradients accumulate into the slot, in micro-batch order
                    slot.accumulate(relay.sums, u == 0)
                    grads[u] = x.grad if layer else None
            if self.device_update is None:
                slot.round_sums(relay.sums)
            self._ship(layer, slot)
        stash.clear()
        if loss_sum is not None:
            loss_sum.wait()

        skipped = self.updater.finish(self.step_count)
        self._marks = (start, self.lanes.mark())
        self.step_count += 1
        return StepStats(
            loss=scalar(total), samples=batch.size, skipped=skipped, extra={"loss_scale": self.scaler.scale}
        )

    def timeline(self) -> dict[str, float] | None:
        """Where the last step's time went (methods.l2l.timeline.breakdown) on one time base, from its start to the
        end of its compute: the device's compute, copies and waits (for an upload, a stash copy, the host), and the
        host's preparing and committing since the previous call (commits of one step run into the next), with the
        prefetches that found their layer's update unfinished. Call once the device has finished the step."""
        if self._marks is None:
            return None
        lanes, (start, end) = self.lanes, self._marks
        wall = lanes.elapsed_ms(start, end)
        at = lambda mark: lanes.elapsed_ms(start, mark)  # noqa: E731
        mine = [(kind, layer, at(a), at(b)) for kind, layer, a, b in self.trace]
        server = self.server
        now = (server.prepare_seconds, server.commit_seconds, self.relay.skipped_prefetches)
        prepare, commit, skipped = (a - b for a, b in zip(now, self._host))
        self._host = now
        up, down = (lanes.moved[k] - self._moved[k] for k in ("h2d", "d2h"))
        return {
            **breakdown(mine, wall, (prepare + commit) * 1e3),
            "host_prepare_ms": prepare * 1e3,
            "host_commit_ms": commit * 1e3,
            "skipped_prefetches": skipped,
            "h2d_bytes": up,  # the step's copies: weights and stashed inputs up, gradients and stashed inputs down
            "d2h_bytes": down,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.updater.drain()
        for future in self.device_update.ready if self.device_update is not None else ():
            future.result()
        return self.server.state_dict()

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        server, slots = self.server, self.relay.slots
        held = self.held.buffers if self.held is not None else []
        return {
            "parameters": [s.flat for s in slots] + server.flat + server.wire,
            "gradients": [s.grad for s in slots] + [self.relay.sums] + held + server.gradient_buffers(),
            "optimizer": server.optimizer_state() + (self.device_update.tensors() if self.device_update else []),
            "stash": self.stash.tensors(),
        }

    def resident_device_bytes(self) -> int:
        # The slots' weights and gradient buffers; stashes, gradients of activations and
        # recompute buffers are allocated inside the step, where the tracker (or CUDA) sees them.
        extra = [x.nbytes() for x in (self.held, self.device_update) if x is not None]
        return self.relay.nbytes() + sum(extra)


@register("l2l-cmp")
class L2LCMP(L2L):
    """L2L with cross mixed precision: 16-bit weights travel and compute; FP32 masters and optimizer stay on host."""

    precisions = ("fp16", "bf16")
