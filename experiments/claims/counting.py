"""The suite's own claim under every counted verdict: a count stands for the device it counts (#12)."""

from __future__ import annotations

from experiments import counted_vs_cuda
from suite.report.claims import Claim, Finding
from suite.report.reading import Reading, Where

H200 = "h200-140gb"  # the one GPU that has checked counts against its allocator


def within_bound(r: Reading) -> Finding:
    """Each row's counted / measured peak (or the verdict a report kept without figures), and how many rows are
    within the bound; reproduced only where every row is."""
    parts, within, rows = [], 0, [row for row in counted_vs_cuda.SHAPES if row in r.rows]
    for row in rows:
        ratio, gap = r.value(row, "counted / measured"), r.value(row, "measured - counted (MB)")
        said = r.rows[row].get(f"within {counted_vs_cuda.BOUND:.0%}")
        r.used.add((row, "within"))
        within += said == "yes"
        parts.append(f"{row} {ratio:.3f} ({gap:+.0f} MB)" if ratio is not None else f"{row} within (no figures kept)")
    if not rows:
        return Finding("no records", "not run")
    word = "reproduced" if within == len(rows) else "not reproduced"
    return Finding("counted / measured: " + ", ".join(parts), f"{word} ({within} of {len(rows)} rows within 5%)")


CLAIMS = [
    Claim(
        "Counted memory stands for the GPU: within 5% of CUDA's allocator",
        "this suite's rule (#12)",
        "every counted verdict rests on it",
        Where("counted-vs-cuda", "paper", H200),
        within_bound,
    ),
]
