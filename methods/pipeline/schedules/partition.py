"""Split an ordered list of layer costs into d contiguous stages minimising the slowest stage."""

from __future__ import annotations

from typing import Sequence


def partition(costs: Sequence[float], d: int) -> list[range]:
    """Exact min-max contiguous partition by dynamic programming, O(d * n^2).

    `costs` are per-layer costs in model order (embed, blocks..., head). Returns d non-empty
    ranges of layer indices covering 0..n-1 in order. The slowest stage bounds pipeline
    throughput, so it is the quantity minimised. Ties are broken deterministically: each
    stage, from the last backwards, starts as early as an optimal split allows."""
    n = len(costs)
    if not isinstance(d, int) or d < 1 or d > n:
        raise ValueError(f"cannot split {n} layers into d={d!r} non-empty contiguous stages (need 1 <= d <= {n})")
    if any(c < 0 for c in costs):
        raise ValueError("layer costs must be non-negative")
    inf = float("inf")
    # best[k][i]: min over splits of layers[:i] into k stages of the max stage cost;
    # cut[k][i]: where the last of those k stages starts.
    best = [[inf] * (n + 1) for _ in range(d + 1)]
    cut = [[0] * (n + 1) for _ in range(d + 1)]
    best[0][0] = 0.0
    for k in range(1, d + 1):
        for i in range(k, n - (d - k) + 1):  # leave at least one layer per remaining stage
            seg = 0.0
            for j in range(i - 1, k - 2, -1):  # last stage = layers[j:i], grown leftwards
                seg += costs[j]  # summed the same way every time, so ties compare exactly
                if seg > best[k][i]:
                    break  # non-negative costs: the segment only grows from here
                c = max(best[k - 1][j], seg)
                if c <= best[k][i]:
                    best[k][i], cut[k][i] = c, j
    stages, i = [], n
    for k in range(d, 0, -1):
        j = cut[k][i]
        stages.append(range(j, i))
        i = j
    return stages[::-1]


def stage_costs(costs: Sequence[float], stages: Sequence[range]) -> list[float]:
    """Sum of layer costs per stage."""
    return [sum(costs[i] for i in r) for r in stages]
