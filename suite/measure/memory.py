"""Memory: a live-bytes tracker standing in for CUDA's allocator counters on CPU, the device cap, host peaks."""

from __future__ import annotations

import resource
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from suite.config.sizes import parse_size


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
        inputs = {
            t.untyped_storage()._cdata
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and not t.is_sparse
        }
        for device, st in new_storages(func, out):
            key = st._cdata
            if device == "cpu" and key not in self._seen and key not in inputs:
                self._seen[key] = st.nbytes()
                self.live += st.nbytes()
                weakref.finalize(st, self._release, key)
        self.peak = max(self.peak, self.live)
        if self.limit is not None and self.base + self.live > self.limit:
            raise torch.OutOfMemoryError(
                f"CPU live-bytes tracker: {self.base + self.live} bytes exceed the --device-memory cap "
                f"of {self.limit} bytes"
            )
        return out


def new_storages(func, out) -> list[tuple[str, torch.UntypedStorage]]:
    """(device type, storage) of each storage `func`'s outputs may have allocated (a fake tensor's storage is on
    `meta`, whatever device the tensor says it is on): none when its schema says an output aliases an input
    (a view, an in-place op; a fake tensor's view need not share its base's storage object, so the schema
    decides, not the storage)."""
    schema = getattr(func, "_schema", None)
    if schema is not None and any(r.alias_info is not None for r in schema.returns):
        return []
    return [
        (t.device.type, t.untyped_storage())
        for t in tree_flatten(out)[0]
        if isinstance(t, torch.Tensor) and not t.is_sparse and t.untyped_storage().nbytes() > 0
    ]


def apply_device_memory_cap(size: str | None, device: torch.device) -> int | None:
    """Cap the CUDA caching allocator at `size` bytes (a smaller GPU on a big one); returns the cap."""
    if size is None:
        return None
    cap = parse_size(size)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if cap > total:
            raise ValueError(f"--device-memory {size} exceeds the device's {total / 2**30:.1f} GiB")
        # torch 2.11 wants an index: a bare "cuda" means the current device.
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(cap / total, index)
    return cap


def host_peak_bytes() -> int:
    """Peak resident set size of this process since it started or since reset_host_peak (Linux: VmHWM; elsewhere
    the process's ru_maxrss, which no reset lowers)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_host_peak() -> bool:
    """Start host_peak_bytes again from the present resident set (a long-lived worker, between cells); whether the
    kernel allowed it (/proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
