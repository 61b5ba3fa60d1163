"""The verdict rules of the claims table, fixed in code: plain numbers in, one short verdict out."""

from __future__ import annotations

from collections.abc import Sequence

GB, GIB = 1e9, 2**30
FLAT = 0.02  # memory "flat in depth": every depth within 2% of the shallowest


def flat(values: Sequence[float | None], labels: Sequence[str], tol: float = FLAT) -> str:
    """Memory flat in depth: every measured value within `tol` of the first. Depths not measured are named."""
    have = [(v, label) for v, label in zip(values, labels) if v is not None]
    if len(have) < 2:
        return "pending (fewer than two depths)"
    first = have[0][0]
    if any(abs(v / first - 1) > tol for v, _ in have):
        worst = max(abs(v / first - 1) for v, _ in have)
        return f"not reproduced ({worst:.0%} from the shallowest)"
    if len(have) == len(values):
        return "reproduced"
    measured = [v is not None for v in values]
    if measured == sorted(measured, reverse=True):  # every depth measured up to one, none after it
        return f"reproduced to {have[-1][1]}"
    return f"reproduced at {', '.join(label for _, label in have)} (not measured at the others)"


def out_of_memory(status: str, gb: float | None, cap_gb: float = 16.0) -> str:
    """The paper's out-of-memory case on a `cap_gb` device: `oom` (or a peak over `cap_gb` GiB) reproduces it; a
    peak over `cap_gb` GB but under `cap_gb` GiB is undecided (the device's own overheads decide); else not."""
    if status == "oom":
        return "reproduced"
    if gb is None:
        return f"pending ({status})"
    if gb * GB > cap_gb * GIB:
        return "reproduced"
    if gb > cap_gb:
        return f"undecided (over {cap_gb:g} GB, under {cap_gb:g} GiB)"
    return "not reproduced"


def gain(ours: Sequence[float | None], paper: Sequence[float]) -> str:
    """A speedup the paper reports as ratios: reproduced where each of ours is at least the paper's; a smaller
    gain where each of ours is above 1 but some below the paper's; else not reproduced."""
    if any(x is None for x in ours):
        return "pending"
    if all(x >= p for x, p in zip(ours, paper)):
        return "reproduced"
    if all(x > 1 for x in ours):
        return "smaller gain"
    return "not reproduced"


def faster(ours: float | None, other: float | None) -> str:
    """One method faster than another (ratios to the same baseline row, one sweep)."""
    if ours is None or other is None:
        return "pending"
    return "reproduced" if ours > other else "not reproduced"


def target(ratios: Sequence[float | None], labels: Sequence[str], at_least: float) -> str:
    """A target ratio: where it is met."""
    if any(x is None for x in ratios):
        return "pending"
    met = [label for x, label in zip(ratios, labels) if x >= at_least]
    if not met:
        return "target not met"
    return "target met" if len(met) == len(labels) else f"target met at {', '.join(met)} only"


def less(ours: float | None, other: float | None) -> str:
    """Less memory than another method needs."""
    if ours is None or other is None:
        return "pending"
    return "reproduced" if ours < other else "not reproduced"


def order(values: dict[str, float | None], expected: Sequence[str]) -> str:
    """The paper's order, largest first: reproduced when ours is the same; else ours is named."""
    if any(values.get(k) is None for k in expected):
        return "pending"
    ours = sorted(expected, key=lambda k: -values[k])  # type: ignore[operator]
    return "reproduced" if list(ours) == list(expected) else "not reproduced (ours: " + " > ".join(ours) + ")"


def grows(values: Sequence[float | None], last_paper: float, tol: float = 0.10) -> str:
    """Grows with the sweep (each value above the one before: the shape), and ends within `tol` of the paper's
    last value (the size)."""
    if any(x is None for x in values) or len(values) < 2:
        return "pending"
    shape = all(b > a for a, b in zip(values, values[1:]))
    size = abs(values[-1] / last_paper - 1) <= tol  # type: ignore[operator]
    if shape and size:
        return "reproduced"
    if shape:
        return "reproduced in shape, not in size"
    return "not reproduced"


def within(errors: Sequence[float | None], bound: float) -> bool:
    """Every error (predicted / measured - 1) within +-`bound`."""
    return all(x is not None and abs(x) <= bound for x in errors)


def within_factor(errors: Sequence[float | None], factor: float) -> bool:
    """Every prediction within a factor of the measured value (error = predicted / measured - 1)."""
    return all(x is not None and 1 / factor <= 1 + x <= factor for x in errors)
