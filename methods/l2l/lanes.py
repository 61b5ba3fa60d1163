"""Copy streams, events and gradient shipments of the L2L relay; on CPU the same calls run synchronously."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
import weakref

import torch


def copy_into(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """`dst.copy_(src)` into a preallocated buffer, issued as a foreach op.

    A foreach op returns nothing, so the CPU live-bytes tracker (which counts every storage an op
    returns that it has not seen yet) does not book a write into an existing slot, host or stash
    buffer as a new device allocation; `copy_` returns `dst` and would be booked. Across devices
    it runs `copy_` per tensor, non_blocking included.
    """
    torch._foreach_copy_([dst], [src], non_blocking=non_blocking)


def zero(t: torch.Tensor) -> None:
    """`t.zero_()` as a foreach op, for the same reason as copy_into."""
    torch._foreach_zero_([t])


def shaped_views(flat: torch.Tensor, like) -> list[torch.Tensor]:
    """Views of `flat` shaped as each tensor of `like`, one after another from its start."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out


PAGE = os.sysconf("SC_PAGE_SIZE")


def host_buffer(numel: int, dtype: torch.dtype, pin: bool, zero: bool = False) -> torch.Tensor:
    """A host buffer of `numel` elements, page-locked when `pin` (what lets a non-blocking copy run on a copy engine
    while the host goes on; pageable memory is staged through a driver buffer, synchronously).

    Pinned at its own size: `pin_memory=True` takes a block of torch's caching host allocator, which rounds every
    request up to a power of two (a 436 MB layer of Llama 3 8B's takes 512 MiB, its 1.05 GB embeddings 2 GiB).
    Here the buffer is ordinary memory on pages of its own, registered with CUDA once (torch's own helper around
    cudaHostRegister) and unregistered when the buffer is let go: at most a page more than it holds, either side."""
    make = torch.zeros if zero else torch.empty
    if not pin or numel == 0:
        return make(numel, dtype=dtype)
    nbytes = numel * dtype.itemsize
    span = -(-nbytes // PAGE) * PAGE
    raw = torch.empty(span + PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE  # its own pages: no registration shares a page with another
    buf = raw[start : start + nbytes].view(dtype)
    if zero:
        buf.zero_()
    _register(buf, raw.data_ptr() + start, span)
    return buf


def _register(buf: torch.Tensor, ptr: int, size: int) -> None:
    from torch.cuda import _pin_memory_utils

    _pin_memory_utils.pin_memory(ptr, size)
    weakref.finalize(buf, _unregister, ptr)  # before its memory can be freed: the buffer still holds it


CUDA_SUCCESS, CUDART_UNLOADING = 0, 4  # cudaError_t: the runtime already unloading at the interpreter's exit


def _unregister(ptr: int) -> None:
    """Unregister pinned pages. cudaHostUnregister reports a failure by its return code, which no `except` sees: a
    code other than success (or the runtime unloading at exit) is said, once per code, never ignored."""
    try:
        code = int(torch.cuda.cudart().cudaHostUnregister(ptr))
    except Exception:  # noqa: BLE001 — at the interpreter's exit CUDA may be gone already
        return
    if code not in (CUDA_SUCCESS, CUDART_UNLOADING) and code not in _said:
        _said.add(code)
        warnings.warn(f"cudaHostUnregister of a pinned host buffer failed with cudaError {code}", stacklevel=2)


_said: set[int] = set()


class Lanes:
    """The compute stream plus one host-to-device and one device-to-host copy stream.

    The two directions get their own streams because a GPU has separate copy engines for them: a
    weight upload and a gradient download can run at the same time as each other and as compute.
    Work on different streams is unordered unless an event says otherwise, so every hand-over
    records an event on the producing stream and makes the consuming stream wait on it; a
    non-blocking copy without that ordering would read half-written weights. On CPU every event
    is None and every copy completes before the call returns, so the ordering is the program order.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.h2d = torch.cuda.Stream(device) if self.cuda else None
        self.d2h = torch.cuda.Stream(device) if self.cuda else None
        self.moved = {"h2d": 0, "d2h": 0}  # bytes copied up and down so far: weights, gradients, stashed inputs

    def tally(self, direction: str, tensor: torch.Tensor) -> None:
        """Count `tensor`'s bytes as copied in `direction` ("h2d" or "d2h")."""
        self.moved[direction] += tensor.numel() * tensor.element_size()

    @property
    def compute(self):
        """The stream the model runs on (whatever stream is current when the step runs)."""
        return torch.cuda.current_stream(self.device) if self.cuda else None

    def on(self, stream):
        """Make `stream` current for the enclosed work (no-op on CPU)."""
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def record(self, stream=None, blocking: bool = False):
        """An event marking the work queued so far on `stream` (default: compute); None on CPU. A `blocking` one is
        waited for by sleeping (cudaEventBlockingSync): a host thread that waits on it leaves its core to others."""
        if not self.cuda:
            return None
        event = torch.cuda.Event(blocking=blocking)
        event.record(stream if stream is not None else self.compute)
        return event

    def mark(self, stream=None):
        """A point on the step's time base: a timing event recorded on `stream` (default: compute) on CUDA, the
        host clock on CPU (where every copy and kernel has finished when its call returns)."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else self.compute)
        return event

    def elapsed_ms(self, start, end) -> float:
        """Milliseconds between two marks (CUDA: both events must have completed)."""
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def wait(self, event, stream=None) -> None:
        """Make `stream` (default: compute) wait for `event` without blocking the host."""
        if event is not None:
            (stream if stream is not None else self.compute).wait_event(event)

    def keep(self, tensor: torch.Tensor, stream) -> None:
        """Tell the caching allocator `tensor` is in use on `stream`, so its memory is not handed out
        again (to a tensor of the allocating stream) before that stream's work on it has finished."""
        if stream is not None:
            tensor.record_stream(stream)


class Shipment:
    """A layer's gradient on its way to a host buffer: summed over ranks (if any), then copied down.

    On CUDA the all-reduce and the non-blocking copy are queued at once, behind the backward that
    produced the gradient; the host waits on the copy's event, the compute stream waits on it
    before the slot's gradient buffer is zeroed for another layer. On CPU there is nothing to queue:
    whichever thread needs the result first (the host worker, or the relay about to reuse the
    buffer) waits for the collective and copies, exactly once.
    """

    def __init__(
        self, lanes: Lanes, src: torch.Tensor, dst: torch.Tensor, work=None, traced: bool = False, produced=None
    ):
        self.lanes, self.src, self.dst, self.work = lanes, src, dst, work
        self.event = self.start = self.end = None  # start, end: marks of the copy when traced (CUDA)
        lanes.tally("d2h", dst)  # copied exactly once, now (CUDA) or by whichever thread needs it first (CPU)
        self._lock = threading.Lock()
        self._done = False
        if lanes.cuda:
            # `produced`: the event after which `src` holds the gradient, where the copy is issued from another thread
            # than the one computing it (torch's current stream is a thread's own); else that thread's stream, now
            produced = produced or lanes.record()
            with lanes.on(lanes.d2h):
                lanes.wait(produced, lanes.d2h)
                if work is not None:
                    work.wait()  # NCCL: makes the current (copy) stream wait for the all-reduce
                self.start = lanes.mark(lanes.d2h) if traced else None
                copy_into(dst, src, non_blocking=True)
                # the host thread waits on it (host_wait) while the update's team needs every core but the launcher's
                self.event = lanes.record(lanes.d2h, blocking=True)
                self.end = lanes.mark(lanes.d2h) if traced else None

    def _complete(self) -> None:
        with self._lock:
            if not self._done:
                if self.work is not None:
                    self.work.wait()
                copy_into(self.dst, self.src)
                self._done = True

    def landed(self) -> bool:
        """Whether the host buffer holds the gradient now (waits for nothing; on CPU the copy is the waiter's)."""
        return self.event.query() if self.lanes.cuda else True

    def host_wait(self) -> None:
        """Block until the host buffer holds the (summed) gradient."""
        if self.lanes.cuda:
            self.event.synchronize()
        else:
            self._complete()

    def device_wait(self) -> None:
        """Order later compute-stream writes to the source buffer after the copy has read it."""
        if self.lanes.cuda:
            self.lanes.wait(self.event)
        else:
            self._complete()
