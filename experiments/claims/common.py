"""The machines the claims are read on, and how their figures are written."""

from __future__ import annotations

from suite.report.reading import ANY_CPU, Reading

H100 = "h100-79gb"  # the first lent GPU (docs/gpu-campaign.md)
CPU = "cpu-epyc-f25m17-avx512bf16-2c"  # the counts at `paper`, Table 7 at `small`, the peers at `tiny`
# The runs at `tiny`: the most complete CPU section of each table, then the newest (suite.report.reading.ANY_CPU)
TINY_CPU = ANY_CPU


def num(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def nums(xs, spec: str, unit: str = "") -> str:
    return ", ".join(num(x, spec) + unit for x in xs)


def figure_or_status(r: Reading, row: str, column: str, spec: str, unit: str = "") -> str:
    """A row's figure, or its status where it has none (`oom`, not run)."""
    v = r.value(row, column)
    return f"{v:{spec}}{unit}" if v is not None else f"`{r.status(row)}`"
