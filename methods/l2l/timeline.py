"""Where one traced L2L step's time goes: device compute, weight, gradient and stash copies, and what the device
waited for while it computed nothing (an upload, a stash copy, or the host)."""

from __future__ import annotations

COMPUTE = ("forward", "backward")
UPLOADS = ("upload",)
STASH = ("stash-down", "stash-up")
COPIES = ("upload", "download", *STASH)


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


def gaps(busy: list[tuple[float, float]], wall_ms: float) -> list[tuple[float, float]]:
    """The parts of [0, wall_ms] that no interval of `busy` covers."""
    out, reach = [], 0.0
    for start, end in sorted(busy):
        if start > reach:
            out.append((reach, min(start, wall_ms)))
        reach = max(reach, end)
    if reach < wall_ms:
        out.append((reach, wall_ms))
    return [(a, b) for a, b in out if b > a]


def _covered(within: list[tuple[float, float]], by: list[tuple[float, float]]) -> float:
    """How much of the intervals `within` (disjoint) the intervals `by` cover."""
    return sum(union([(max(a, c), min(b, d)) for c, d in by if min(b, d) > max(a, c)]) for a, b in within)


def breakdown(step_spans: list[tuple[str, int, float, float]], wall_ms: float, host_ms: float) -> dict[str, float]:
    """Split a step of `wall_ms` (spans relative to its start) into compute, copies (and how much of them compute
    hid), the host's update time, and the device's idle time by what it waited for: a weight upload in flight,
    else a stash copy in flight, else the host (a commit the next upload needs, or the host thread queuing work).
    `device_busy` is the share of the wall time in which the device computed."""
    of = lambda kinds: [(a, b) for kind, _, a, b in step_spans if kind in kinds]  # noqa: E731
    compute, copies = of(COMPUTE), of(COPIES)
    compute_ms, copy_ms = union(compute), union(copies)
    exposed_copy_ms = union(compute + copies) - compute_ms  # copy time with no compute beside it
    idle = gaps(compute, wall_ms)
    idle_ms = sum(b - a for a, b in idle)
    upload_wait = _covered(idle, of(UPLOADS))
    copy_wait = _covered(idle, of(UPLOADS + STASH))
    return {
        "wall_ms": wall_ms,
        "compute_ms": compute_ms,
        "upload_ms": union(of(UPLOADS)),
        "download_ms": union(of(("download",))),
        "stash_copy_ms": union(of(STASH)),
        "copy_ms": copy_ms,
        "copy_hidden_ms": copy_ms - exposed_copy_ms,
        "host_update_ms": host_ms,
        "device_idle_ms": idle_ms,
        "upload_wait_ms": upload_wait,
        "stash_wait_ms": copy_wait - upload_wait,
        "host_wait_ms": idle_ms - copy_wait,
        "device_busy": compute_ms / wall_ms if wall_ms > 0 else 0.0,
    }
