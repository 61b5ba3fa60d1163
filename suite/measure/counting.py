"""Counting instead of measuring: a method's own step on tensors that hold no data, its memory counted exactly."""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from suite.measure.memory import LiveBytesTracker

CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 bytes


def count(
    build: Callable[[], object],
    batches: Callable[[], Iterator],
    warmup: int = 1,
    round_to: int = 1,
    limit: int | None = None,
) -> dict:
    """Build the method and its batches under FakeTensorMode, run `warmup` steps, then count one step's live
    bytes on top of what the method keeps resident: the same tracker as a CPU measurement, on shapes alone.
    `round_to=CUDA_BLOCK` rounds each storage as the caching allocator would; past `limit` bytes it raises
    torch.OutOfMemoryError, as a capped device would."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        method = build()
        stream = batches()
        for _ in range(warmup):
            method.step(next(stream))
        resident = method.resident_device_bytes()
        if limit is not None and resident > limit:
            raise torch.OutOfMemoryError(f"counted: {resident} resident bytes exceed the cap of {limit} bytes")
        with LiveBytesTracker(limit=limit, base=resident, round_to=round_to) as tracker:
            method.step(next(stream))
    return {
        "memory_kind": "counted (fake tensors: live-bytes tracker, resident + step peak)",
        "resident_bytes": resident,
        "step_peak_bytes": tracker.peak,
        "device_peak_allocated": resident + tracker.peak,
        "memory_gb": (resident + tracker.peak) / 1e9,
    }
