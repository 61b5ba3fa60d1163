"""When the host updates each layer: after the whole backward (Algorithm 2) or during it (L2Lp, overlap=on)."""

from __future__ import annotations

import itertools
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from suite.harness.device import host_flag, is_fake

RING = 3  # landing buffers when each gradient is applied as it lands: two layers of slack for the host


def _done() -> Future:
    future: Future = Future()
    future.set_result(None)
    return future


def _run(future: Future, fn, args) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except BaseException as exc:  # noqa: BLE001 — delivered by result(), as a pool's would be
        future.set_exception(exc)


class InLine:
    """An executor that runs each task at once, in the caller's thread: a counted step's host work, which the
    ledger (one thread's dispatch mode) must see."""

    def submit(self, fn, *args, layer: int = -1, landed=None) -> Future:
        future: Future = Future()
        _run(future, fn, args)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


class LayerQueue:
    """One host thread that runs the step's host tasks, the lowest layer first among those whose gradient has
    landed, else the oldest (which then waits for its gradient, the first to land: downloads run in order).

    During the backward the tasks arrive head first, so this is their arrival order whenever the host keeps up;
    when it falls behind, the layers the next forward needs first (the lowest) are updated first, and what is
    left when the backward ends is the top of the model, which the next forward reaches last. Tasks without a
    layer (the step's verdict) have layer -1: first among the ready ones.

    The thread is a one-worker ThreadPoolExecutor's (joined when the interpreter exits, as every executor's is):
    each submit queues the task and one turn of the worker, and each turn runs the best task queued then.
    """

    def __init__(self, name: str = "l2l-host"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._tasks: list[tuple[int, int, object, Future, object, tuple]] = []  # (layer, seq, landed, future, fn, args)
        self._seq = itertools.count()

    def submit(self, fn, *args, layer: int = -1, landed=None) -> Future:
        """Queue fn(*args) for `layer`; `landed()` says whether its input has arrived (None: it has)."""
        future: Future = Future()
        with self._lock:
            self._tasks.append((layer, next(self._seq), landed, future, fn, args))
        self._pool.submit(self._turn)
        return future

    def _turn(self) -> None:
        with self._lock:
            ready = [t for t in self._tasks if t[2] is None or t[2]()]
            task = min(ready, key=lambda t: (t[0], t[1])) if ready else min(self._tasks, key=lambda t: t[1])
            self._tasks.remove(task)
        _, _, _, future, fn, args = task
        _run(future, fn, args)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)


class HostUpdater:
    """Runs each step's host work (landing, unscaling, norms, optimizer updates) on one host thread.

    overlap=off is the paper's Algorithm 2: once the backward has finished, every layer is
    prepared, the step is checked and every layer updated. overlap=on updates layer l on the host
    while the device computes the backward of layer l-1 (torch ops release the GIL).

    A global gate (fp16 overflow: one overflowing layer skips the whole step; clipping: the scale
    needs the norm over all layers) is only decided once the last gradient, the embeddings', has
    arrived. Under a gate each layer's preparation (widening, unscaling, its overflow flag, its
    norms) still runs during the backward as its gradient lands, and once the verdict is known the
    commits are queued in the order the next forward needs them (embeddings first) without
    blocking step(): they run beside the next step's forward, whose upload of layer l starts as
    soon as layer l's commit lands (`ready[l]`; the relay's host thread waits on that future, and a
    prefetch that finds it unfinished is counted in `relay.skipped_prefetches`). No weight or
    optimizer state is touched before the verdict, so a skipped step has nothing to undo.

    The host thread takes the lowest layer first among the tasks whose gradient has landed
    (LayerQueue): when the host falls behind the device, ungated or gated, the layers the next
    forward needs first are committed first, and the next forward starts while the top layers'
    commits still run.

    The host thread runs the host work whether or not it overlaps: one code path, and on CPU its
    temporaries stay out of the live-bytes tracker, which follows the thread running the device step. A counted
    step (fake tensors) runs it in line instead, so that its host temporaries are counted: one task at a time,
    as on the one host thread.
    """

    def __init__(self, server, scaler, run, overlap: bool, invalidate, held=None):
        self.server, self.scaler, self.run, self.overlap = server, scaler, run, overlap
        self.invalidate = invalidate  # a committed layer's device copy is stale
        # Clipping decided on the device (`held`, the relay's DeviceGradients: every layer's gradient kept there
        # until the norm is known), or on the host from every held landing
        self.held = held
        self.clip = run.clip_grad_norm > 0 and held is None
        self.gated = scaler.enabled or self.clip
        if self.gated and server.ring is not None:  # a gate needs every gradient before the first commit
            raise ValueError("a gated step (loss scaling or clipping) holds every layer's landing: ring=None")
        if held is not None and (server.ring is None or not server.forward or scaler.enabled):
            raise ValueError("gradients held on the device ship through a ring, embeddings first, ungated")
        counted = is_fake(server.flat[0])
        self.pool = InLine() if counted else LayerQueue()
        weakref.finalize(self, self.pool.shutdown, wait=False)
        n = server.num_layers
        self.ready: list[Future] = [_done()] * n  # per layer: its latest commit (uploads wait for it)
        self.prepared: list[Future | None] = [None] * n
        self.shipments: list = [None] * n

    @staticmethod
    def ring(run, overlap: bool) -> int | None:
        """How many landing buffers the host's gradients pass through: RING where each is applied as it lands
        (overlap=on with no host gate: bf16 or FP32, clipped on the device or not), else None, one per layer held
        until its commit."""
        gated = run.precision == "fp16"  # fp16 is loss-scaled: its overflow gates a step
        return RING if overlap and not gated else None

    @staticmethod
    def clips_on_device(run, overlap: bool) -> bool:
        """Whether clipping's norm is taken on the device, each layer's gradient held there until it is known, so
        that the host applies every gradient as it lands (no landing a layer on the host): clipping with a ring."""
        return run.clip_grad_norm > 0 and HostUpdater.ring(run, overlap) is not None

    def landing(self, layer: int) -> torch.Tensor:
        """Where `layer`'s gradient lands; a ring buffer once its last user's update has finished."""
        last = self.server.reuses(layer)
        if last is not None:
            self.ready[last].result()
        return self.server.landing_for(layer)

    def layer_done(self, layer: int, shipment, step: int) -> None:
        """The backward of `layer` has finished and its gradient is on its way to the host (held on the device:
        `shipment` is None, and finish() ships it)."""
        if self.held is not None:
            return
        if not self.overlap:
            self.shipments[layer] = shipment
        elif self.gated:
            self.prepared[layer] = self.pool.submit(
                self.server.prepare, layer, shipment, self.scaler, self.clip, layer=layer, landed=shipment.landed
            )
        else:
            self.invalidate(layer)
            self.ready[layer] = self.pool.submit(
                self._prepare_commit, layer, shipment, step, layer=layer, landed=shipment.landed
            )

    def _prepare_commit(self, layer: int, shipment, step: int) -> None:
        self.server.prepare(layer, shipment, self.scaler, False)
        self.server.commit(layer, step, self.scaler)

    def _decide(self, prepared) -> tuple[bool, torch.Tensor | None]:
        """(skip the step?, clipping coefficient) from every layer's (found_inf, norms), in layer order."""
        found = self.scaler.enabled and host_flag(torch.cat([f for f, _ in prepared]).any())
        if not self.clip or found:
            return found, None
        # As clip_grad_norm_ does: the norm of the per-tensor norms, stacked in parameter order.
        total = torch.linalg.vector_norm(torch.stack([t for _, norms in prepared for t in norms]), 2.0)
        return found, torch.clamp(self.run.clip_grad_norm / (total + 1e-6), max=1.0)

    def _all(self, step: int) -> bool:
        n = self.server.num_layers
        prepared = [self.server.prepare(i, self.shipments[i], self.scaler, self.clip) for i in range(n)]
        self.shipments = [None] * n
        skipped, coef = self._decide(prepared)
        if not skipped:
            for i in range(n):
                self.server.commit(i, step, self.scaler, coef)
        return skipped

    def finish(self, step: int) -> bool:
        """The backward of every layer has been issued: decide the gates and commit (or skip) the
        updates. Returns whether the step was skipped."""
        n = self.server.num_layers
        skipped = False
        if not self.overlap:
            skipped = self.pool.submit(self._all, step).result()
            if not skipped:
                for i in range(n):
                    self.invalidate(i)
        elif self.held is not None:
            self._ship_held(step)
        elif self.gated:
            prepared = [f.result() for f in self.prepared]
            self.prepared = [None] * n
            skipped, coef = self.pool.submit(self._decide, prepared).result()
            if not skipped:
                for i in range(n):
                    self.invalidate(i)
                    self.ready[i] = self.pool.submit(self.server.commit, i, step, self.scaler, coef, layer=i)
        self.scaler.update(skipped)
        return skipped

    def _ship_held(self, step: int) -> None:
        """Clipping's coefficient from the norms taken on the device, then every held gradient shipped and committed
        on the host thread, embeddings first (the order the next forward needs them): the first RING downloads
        queued at once, each later one into the landing a commit has just freed. Each layer's `ready` is resolved
        as its commit lands, so the next forward starts while the top layers are still being committed."""
        n = self.server.num_layers
        total = self.held.total_norm()
        # As the host gate's: clamp(max_norm / (norm + 1e-6), max=1), a float32 on the host
        coef = torch.clamp(self.run.clip_grad_norm / (total + 1e-6), max=1.0).float().cpu()
        for i in range(n):
            self.invalidate(i)
        self.ready = [Future() for _ in range(n)]
        self.pool.submit(self._commit_held, step, coef, self.ready)

    def _commit_held(self, step: int, coef: torch.Tensor, ready: list[Future]) -> None:
        n, ring, server = self.server.num_layers, self.server.ring, self.server
        try:
            shipments = {j: self.held.ship(j, server.landing_for(j)) for j in range(min(ring, n))}
            for i in range(n):
                server.prepare(i, shipments.pop(i), self.scaler, False)
                server.commit(i, step, self.scaler, coef)
                ready[i].set_result(None)
                if i + ring < n:  # its landing is free: the next download into it
                    shipments[i + ring] = self.held.ship(i + ring, server.landing_for(i + ring))
        except BaseException as exc:  # noqa: BLE001 — every waiting upload hears of it
            for future in ready:
                if not future.done():
                    future.set_exception(exc)
            raise

    def drain(self) -> None:
        """Wait for every queued update (before reading the weights)."""
        for future in self.ready:
            future.result()
