"""What the benchmarks share: their definition as experiments, settings' defaults, measured cells, markdown tables."""

from __future__ import annotations

from collections.abc import Iterator

from suite.core.experiment import Experiment, Metric
from suite.core.registry import Option


def defaults(settings: dict[str, Option]) -> dict:
    """Every setting at its default, for an experiment's base config (so that each is part of a cell's key)."""
    return {k: o.default for k, o in settings.items()}


def measured(cells: list, records: list[dict | None]) -> Iterator[tuple]:
    """(cell, metrics) of every cell of a section whose record finished `ok`, in the rows' order."""
    for cell, rec in zip(cells, records):
        if rec and rec.get("status") == "ok":
            yield cell, rec["metrics"]


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: its heading, the rule, one line a row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def benchmark(name: str, title: str, source: str, figures: list[tuple[str, str, str]], **definition) -> Experiment:
    """A benchmark as an experiment: cells of the kind of its own name, and `figures` (key, label, format) shown as
    measured, with no paper column and no ratio to another row (a benchmark's ratios are taken inside one cell).
    `definition`: the rest of the Experiment (rows, base, settings, detail, notes, ...)."""
    metrics = [Metric(key, label, fmt, ratio=False, paper=False) for key, label, fmt in figures]
    rows = definition["rows"]
    definition.setdefault("label_columns", [])
    return Experiment(name, title, source, metrics, baseline=rows("tiny")[0].name, kind=name, **definition)
