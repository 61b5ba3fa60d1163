"""The suite's own claim under every counted verdict: a count stands for the device it counts (#12)."""

from __future__ import annotations

from experiments import counted_vs_cuda
from suite.report.claims import Claim, Finding
from suite.report.reading import Reading, Where

H200 = "h200-140gb"  # the one GPU that has checked counts against its allocator


def within_bound(r: Reading) -> Finding:
    """Each row's counted / measured peak (or the verdict a report kept without figures), and how many rows are
    within the bound; reproduced only where every row is, pending while any row has no figures or verdict yet."""
    bound = f"within {counted_vs_cuda.BOUND:.0%}"
    parts, within, waiting = [], 0, []
    for row in counted_vs_cuda.SHAPES:
        ratio, gap = r.value(row, "counted / measured"), r.value(row, "measured - counted (MB)")
        said = r.rows.get(row, {}).get(bound)
        r.used.add((row, bound))
        if said not in ("yes", "no"):  # not run, pending, failed: no verdict of its own
            waiting.append(row)
            parts.append(f"{row} `{r.status(row)}`")
            continue
        within += said == "yes"
        parts.append(f"{row} {ratio:.3f} ({gap:+.0f} MB)" if ratio is not None else f"{row} within (no figures kept)")
    ours = "counted / measured: " + ", ".join(parts)
    if waiting:
        return Finding(ours, f"pending ({', '.join(waiting)} not measured)")
    word = "reproduced" if within == len(parts) else "not reproduced"
    return Finding(ours, f"{word} ({within} of {len(parts)} rows {bound})")


CLAIMS = [
    Claim(
        f"Counted memory stands for the GPU: within {counted_vs_cuda.BOUND:.0%} of CUDA's allocator",
        "this suite's rule (#12)",
        "every counted verdict rests on it",
        Where("counted-vs-cuda", "paper", H200),
        within_bound,
    ),
]
