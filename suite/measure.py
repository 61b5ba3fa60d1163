"""Measurement: step throughput, device memory (CUDA peaks or a CPU live-bytes tracker), host memory, a memory cap."""
from __future__ import annotations

import resource
import statistics
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from suite.config import parse_size
from suite.device import synchronize

METHODOLOGY_VERSION = "1"


class LiveBytesTracker(TorchDispatchMode):
    """Follows every storage allocated while active (views share a storage and are not counted twice).

    A stand-in for CUDA's allocator statistics on CPU, so that memory-versus-depth claims can be
    tested without a GPU; `limit` makes it raise an out-of-memory error past a byte budget.
    """

    def __init__(self, limit: int | None = None, base: int = 0):
        super().__init__()
        self.limit, self.base = limit, base
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _release(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Views and in-place ops return an input's storage: not an allocation, even when that
        # storage predates the tracker (a weight, a preallocated buffer).
        inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and not t.is_sparse}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_sparse:
                st = t.untyped_storage()
                key = st._cdata
                if key not in self._seen and key not in inputs and st.nbytes() > 0:
                    self._seen[key] = st.nbytes()
                    self.live += st.nbytes()
                    weakref.finalize(st, self._release, key)
        self.peak = max(self.peak, self.live)
        if self.limit is not None and self.base + self.live > self.limit:
            raise torch.OutOfMemoryError(
                f"CPU live-bytes tracker: {self.base + self.live} bytes exceed the --device-memory cap "
                f"of {self.limit} bytes")
        return out


def apply_device_memory_cap(size: str | None, device: torch.device) -> int | None:
    """Cap the CUDA caching allocator at `size` bytes (a smaller GPU on a big one); returns the cap."""
    if size is None:
        return None
    cap = parse_size(size)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if cap > total:
            raise ValueError(f"--device-memory {size} exceeds the device's {total / 2**30:.1f} GiB")
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
    return cap


def host_peak_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Measurement:
    """Numbers of one cell: timing over the timed steps and memory peaks."""

    step_times: list[float] = field(default_factory=list)
    samples_per_step: int = 0
    device_memory_kind: str = ""
    device_peak_allocated: int = 0
    device_peak_reserved: int = 0
    host_peak: int = 0
    pinned_host_peak: int = 0
    losses: list[float] = field(default_factory=list)
    skipped_steps: int = 0

    def summary(self) -> dict[str, float | int | str]:
        med = statistics.median(self.step_times)
        return {
            "throughput": self.samples_per_step / med,
            "step_time_median": med,
            "step_time_min": min(self.step_times),
            "step_time_max": max(self.step_times),
            "timed_steps": len(self.step_times),
            "samples_per_step": self.samples_per_step,
            "memory_gb": self.device_peak_allocated / 1e9,
            "memory_reserved_gb": self.device_peak_reserved / 1e9,
            "memory_kind": self.device_memory_kind,
            "device_peak_allocated": self.device_peak_allocated,
            "device_peak_reserved": self.device_peak_reserved,
            "host_peak_gb": self.host_peak / 1e9,
            "pinned_host_peak_gb": self.pinned_host_peak / 1e9,
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "skipped_steps": self.skipped_steps,
        }


def measure(method, batches, warmup: int, steps: int, device: torch.device, cap: int | None = None) -> Measurement:
    """Warm up, time `steps` steps (median kept), and record device and host memory peaks.

    On CUDA the peaks cover warm-up and timed steps. On CPU one extra step runs under the
    live-bytes tracker (untimed: the tracker slows every op) on top of the method's resident bytes.
    """
    m = Measurement()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        method.step(next(batches))
    for _ in range(steps):
        batch = next(batches)
        synchronize(device)
        t0 = time.perf_counter()
        stats = method.step(batch)
        synchronize(device)
        m.step_times.append(time.perf_counter() - t0)
        m.samples_per_step = stats.samples
        m.losses.append(stats.loss)
        m.skipped_steps += int(stats.skipped)
    if device.type == "cuda":
        m.device_memory_kind = "cuda peak allocated/reserved"
        m.device_peak_allocated = torch.cuda.max_memory_allocated(device)
        m.device_peak_reserved = torch.cuda.max_memory_reserved(device)
        if hasattr(torch.cuda, "host_memory_stats"):
            m.pinned_host_peak = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    else:
        resident = method.resident_device_bytes()
        with LiveBytesTracker(limit=cap, base=resident) as tracker:
            method.step(next(batches))
        m.device_memory_kind = "cpu live-bytes tracker (resident + step peak)"
        m.device_peak_allocated = m.device_peak_reserved = resident + tracker.peak
    m.host_peak = host_peak_bytes()
    return m
