"""When the host updates each layer: after the whole backward (Algorithm 2) or during it (L2Lp, overlap=on)."""

from __future__ import annotations

import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from suite.harness.device import host_flag, is_fake


def _done() -> Future:
    future: Future = Future()
    future.set_result(None)
    return future


class InLine:
    """An executor that runs each task at once, in the caller's thread: a counted step's host work, which the
    ledger (one thread's dispatch mode) must see."""

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 — delivered by result(), as a worker's would be
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


class HostUpdater:
    """Runs each step's host work (landing, unscaling, norms, optimizer updates) on one worker thread.

    overlap=off is the paper's Algorithm 2: once the backward has finished, every layer is
    prepared, the step is checked and every layer updated. overlap=on updates layer l on the worker
    while the device computes the backward of layer l-1 (torch ops release the GIL).

    A global gate (fp16 overflow: one overflowing layer skips the whole step; clipping: the scale
    needs the norm over all layers) is only decided once the last gradient, the embeddings', has
    arrived. Under a gate only the per-layer preparation overlaps the backward; the commits wait for
    the decision and are then queued in forward order (embeddings first) without blocking step():
    they overlap the next step's forward, whose upload of layer l waits for layer l's commit
    (`ready[l]`). So a skipped step has no partial update to undo, and no weight or optimizer
    state is touched before the decision; the price is that commits run beside the next forward
    instead of beside this backward, and every layer's gradient waits on the host until then.

    The worker runs the host work whether or not it overlaps: one code path, and on CPU its
    temporaries stay out of the live-bytes tracker, which follows the thread running the device step. A counted
    step (fake tensors) runs it in line instead, so that its host temporaries are counted: one task at a time,
    as on the one worker.
    """

    def __init__(self, server, scaler, run, overlap: bool, invalidate):
        self.server, self.scaler, self.run, self.overlap = server, scaler, run, overlap
        self.invalidate = invalidate  # a committed layer's device copy is stale
        self.clip = run.clip_grad_norm > 0
        self.gated = scaler.enabled or self.clip
        counted = is_fake(server.flat[0])
        self.pool = InLine() if counted else ThreadPoolExecutor(max_workers=1, thread_name_prefix="l2l-host")
        weakref.finalize(self, self.pool.shutdown, wait=False)
        n = server.num_layers
        self.ready: list[Future] = [_done()] * n  # per layer: its latest commit (uploads wait for it)
        self.prepared: list[Future | None] = [None] * n
        self.shipments: list = [None] * n

    def layer_done(self, layer: int, shipment, step: int) -> None:
        """The backward of `layer` has finished and its gradient is on its way to the host."""
        if not self.overlap:
            self.shipments[layer] = shipment
        elif self.gated:
            self.prepared[layer] = self.pool.submit(self.server.prepare, layer, shipment, self.scaler, self.clip)
        else:
            self.invalidate(layer)
            self.ready[layer] = self.pool.submit(self._prepare_commit, layer, shipment, step)

    def _prepare_commit(self, layer: int, shipment, step: int) -> None:
        self.server.prepare(layer, shipment, self.scaler, False)
        self.server.commit(layer, step)

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
                self.server.commit(i, step, coef)
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
        elif self.gated:
            prepared = [f.result() for f in self.prepared]
            self.prepared = [None] * n
            skipped, coef = self.pool.submit(self._decide, prepared).result()
            if not skipped:
                for i in range(n):
                    self.invalidate(i)
                    self.ready[i] = self.pool.submit(self.server.commit, i, step, coef)
        self.scaler.update(skipped)
        return skipped

    def drain(self) -> None:
        """Wait for every queued update (before reading the weights)."""
        for future in self.ready:
            future.result()
