"""Where one traced L2L step's time goes: device compute, weight and gradient copies, host updates, device idle."""

from __future__ import annotations

COMPUTE = ("forward", "backward")
COPIES = ("upload", "download")


def spans(trace: list, base) -> list[tuple[str, int, float, float]]:
    """(kind, layer, start ms, end ms) from the traced CUDA events, relative to the event `base`
    (recorded before the step; call after synchronising)."""
    return [(kind, layer, base.elapsed_time(start), base.elapsed_time(end)) for kind, layer, start, end in trace]


def union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Length of the intersection of two intervals."""
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def breakdown(step_spans: list[tuple[str, int, float, float]], wall_ms: float, host_ms: float) -> dict[str, float]:
    """Split a step of `wall_ms` into compute, copies (and how much of them compute hid), host update
    time (the worker's busy time) and device idle time (wall time with no compute running)."""
    of = lambda kinds: [(a, b) for kind, _, a, b in step_spans if kind in kinds]  # noqa: E731
    compute, copies = of(COMPUTE), of(COPIES)
    compute_ms, copy_ms = union(compute), union(copies)
    exposed_copy_ms = union(compute + copies) - compute_ms  # copy time with no compute beside it
    return {
        "wall_ms": wall_ms,
        "compute_ms": compute_ms,
        "upload_ms": union(of(("upload",))),
        "download_ms": union(of(("download",))),
        "copy_ms": copy_ms,
        "copy_hidden_ms": copy_ms - exposed_copy_ms,
        "host_update_ms": host_ms,
        "device_idle_ms": max(0.0, wall_ms - compute_ms),
    }
