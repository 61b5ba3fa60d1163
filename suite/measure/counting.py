"""Counting instead of measuring: a method's own step on tensors that hold no data, its memory counted exactly."""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._python_dispatch import TorchDispatchMode

from suite.measure.memory import new_storages

CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 bytes
ROLES = ("parameters", "gradients", "optimizer", "stash", "transient")
PLACES = ("device", "host")
SPLIT_STEP = 1e-3  # a peak is split by role again once it passes the last split by this fraction
# What a count cannot see, each its own term beside the counted peak (never folded into it).
NOT_COUNTED = (
    "CUDA context and kernels (outside the allocator: not in max_memory_allocated; ~0.3-0.6 GB in nvidia-smi), "
    "cuBLAS/cuBLASLt workspaces (inside max_memory_allocated on a GPU: tens of MB; 68 MB on the H100 run), "
    "fragmentation (reserved minus allocated)"
)


class Ledger(TorchDispatchMode):
    """Every storage allocated while active, by place (the method's device or the host) and, at each place's
    peak, by role: parameters, gradients and optimizer state (as the method names them), stashed activations
    (saved for a backward, or held by the method's stash) and transient activations (the rest).

    Device storages are rounded as the caching allocator rounds them; past `limit` device bytes it raises
    torch.OutOfMemoryError, as a capped device would."""

    def __init__(self, device_type: str, round_to: int = CUDA_BLOCK, limit: int | None = None):
        super().__init__()
        self.device_type, self.round_to, self.limit = device_type, round_to, limit
        self.sizes: dict[int, tuple[str, int]] = {}  # storage key -> (place, bytes)
        self.live = dict.fromkeys(PLACES, 0)
        self.peak = dict.fromkeys(PLACES, 0)
        self.saved: set[int] = set()  # storages some autograd node saved for its backward
        self.roles: Callable[[], dict[str, list]] = dict
        self.breakdown: dict[str, dict[str, int]] = {p: {} for p in PLACES}
        self._snapped = dict.fromkeys(PLACES, -1)
        self._dead: list[int] = []  # storages freed since the last op, not yet taken off

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.settle()
        out = func(*args, **(kwargs or {}))
        self.settle()
        for device, st in new_storages(func, out):
            key = st._cdata
            if key in self.sizes:
                continue
            place = "device" if device == self.device_type else "host"
            size = -(-st.nbytes() // self.round_to) * self.round_to if place == "device" else st.nbytes()
            self.sizes[key] = (place, size)
            self.live[place] += size
            self.peak[place] = max(self.peak[place], self.live[place])
            weakref.finalize(st, self._dead.append, key)
        if self.limit is not None and self.live["device"] > self.limit:
            raise torch.OutOfMemoryError(
                f"counted: {self.live['device']} device bytes exceed the cap of {self.limit} bytes"
            )
        return out

    def settle(self) -> None:
        """Take off the storages freed since the last op. A finalizer only notes the key: it runs in the middle
        of whatever dropped the storage (a `p.grad = None`), where reading tensors is not safe."""
        while self._dead:
            key = self._dead.pop()
            place, size = self.sizes.get(key, (None, 0))
            if place is not None:
                self._snapshot(place)  # about to fall from a peak: say what held it
                self.live[place] -= size
                del self.sizes[key]
                self.saved.discard(key)

    def _snapshot(self, place: str) -> None:
        # A peak that creeps up (a few bytes kept per layer) would be split again at every layer, each time over
        # every storage: a new split only past SPLIT_STEP above the last, the rest added to `transient` at the end.
        if self.live[place] != self.peak[place] or self.peak[place] <= self._snapped[place] * (1 + SPLIT_STEP):
            return
        self._snapped[place] = self.peak[place]
        role_of = {}
        for role, tensors in self.roles().items():
            for t in tensors:
                role_of.setdefault(t.untyped_storage()._cdata, role)
        split = dict.fromkeys(ROLES, 0)
        for key, (where, size) in self.sizes.items():
            if where == place:
                role = role_of.get(key) or ("stash" if key in self.saved else "transient")
                split[role] += size
        self.breakdown[place] = split

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks' pack: note the storage a backward will read, keep the tensor itself."""
        self.saved.add(t.untyped_storage()._cdata)
        return t

    def reset_peak(self) -> None:
        """From here on, peaks of what is live now plus what comes (the measured step after warm-up)."""
        self.settle()
        self.peak = dict(self.live)
        self._snapped = dict.fromkeys(PLACES, -1)
        self.breakdown = {p: {} for p in PLACES}

    def close(self) -> None:
        self.settle()
        for place in PLACES:
            self._snapshot(place)  # a peak still standing at the end
            split = self.breakdown[place]
            if split:  # what the peak gained after its last split (at most SPLIT_STEP of it)
                split["transient"] += self.peak[place] - sum(split.values())


@contextmanager
def fused_attention():
    """SDPA on `meta` tensors (a hosted method's device in a count) as a GPU runs it. torch picks a fused kernel by
    device, and on `meta` it falls back to the math path, which holds the S x S scores and softmax for the backward:
    at a Llama's 8192 tokens, gigabytes a layer that CUDA's flash attention never allocates. Here an unmasked or
    masked SDPA without dropout on `meta` runs the CPU's flash kernel instead, which keeps what CUDA's does for its
    backward (queries, keys, values, output and the row log-sum-exp); every other call goes through unchanged (the
    keyed dropout's attention never reaches SDPA)."""
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if q.device.type != "meta" or dropout_p:
            return real(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


def count(
    build: Callable[[], object],
    batches: Callable[[], Iterator],
    device: torch.device,
    warmup: int = 1,
    round_to: int = CUDA_BLOCK,
    limit: int | None = None,
) -> dict:
    """Build the method on `device` and its batches, all under FakeTensorMode, run `warmup` steps, then count
    one more step: peak bytes on the device (storages on `device`'s type) and on the host (every other
    storage; none when the device is the CPU), each split by role at its peak, and what stays resident.

    A method whose state lives on the host (L2L) is built on the `meta` device, so that its device and host
    tensors differ in type; its host work runs in line (the ledger follows one thread)."""
    # No cap while building: a real build makes the whole model on the host first, and a pipeline stage keeps only
    # its own layers; counted on the CPU, that host is the device. The cap holds from the first step on.
    ledger = Ledger(device.type, round_to)
    with (
        FakeTensorMode(allow_non_fake_inputs=True),
        ledger,
        saved_tensors_hooks(ledger.pack, lambda t: t),
        fused_attention(),
    ):
        try:
            method = build()
            ledger.roles, ledger.limit = method.memory_roles, limit
            stream = batches()
            for _ in range(warmup):
                method.step(next(stream))
            ledger.reset_peak()
            resident = dict(ledger.live)
            method.step(next(stream))
            ledger.close()
        except torch.OutOfMemoryError as exc:
            exc.metrics = {"memory_kind": "counted", "oom_device_bytes": ledger.live["device"], "cap": limit}
            raise
    hosted = device.type != "cpu"  # on the CPU, the device is the host: nothing is counted apart
    out = {
        "memory_kind": "counted (fake tensors: storages by place and role, device rounded to 512 B)",
        "device_peak_allocated": ledger.peak["device"],
        "memory_gb": ledger.peak["device"] / 1e9,
        "device_resident_bytes": resident["device"],
        "device_breakdown": ledger.breakdown["device"],
        "not_counted": NOT_COUNTED,
    }
    if hosted:
        out.update(
            host_peak_bytes=ledger.peak["host"],
            host_peak_gb=ledger.peak["host"] / 1e9,
            host_resident_bytes=resident["host"],
            host_breakdown=ledger.breakdown["host"],
        )
    return out
