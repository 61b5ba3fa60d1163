"""One section of an experiment's table, read for a claim: its rows as the table shows them, and their records."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite.core.experiment import get_experiment
from suite.records.schema import Record
from suite.records.trust import MIN_ROUNDS, timing_rounds
from suite.report import tables


@dataclass(frozen=True)
class Where:
    """Which section of which table: the experiment, its profile, the machine (its slug), counted or measured."""

    experiment: str
    profile: str
    machine: str
    counted: bool = False

    def label(self) -> str:
        return f"`{self.machine}`, {self.profile}, {'counted' if self.counted else 'measured'}"

    def matches(self, title: str) -> bool:
        """Whether a section title of `tables.sections` is this one: the experiment's default run, measured or
        counted, never a variant (a cap, an override, several nodes)."""
        head = f"{self.profile} profile on {self.machine} ("
        variant = title.partition(" device)")[2]
        return title.startswith(head) and variant == (", counted (fake tensors), not measured" if self.counted else "")


@dataclass
class Reading:
    """The rows of one section: each row's values by column name, as `tables.table_rows` gives them."""

    where: Where
    rows: dict[str, dict[str, Any]]
    records: dict[str, Record | None]
    used: set[tuple[str, str]] = field(default_factory=set)  # (row, column) a claim read: what its verdict rests on

    def status(self, row: str) -> str:
        """A row's status as its record says it (the table's column adds notes: contended, suspect, another code)."""
        self.used.add((row, "status"))
        if self.records.get(row):
            return str(self.records[row]["status"])
        return str(self.rows[row]["status"]) if row in self.rows else "not in the table"

    def value(self, row: str, column: str) -> float | None:
        """A row's figure in `column`, or None where it has none (not run, out of memory, not a number)."""
        self.used.add((row, column))
        x = self.rows.get(row, {}).get(column)
        return x if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else None

    def records_read(self, column: str) -> dict[str, Record]:
        """Every row's record, each noted as read in `column` (a judge that reads whole records, such as Table 7's,
        rests its verdict on all of them, and their doubts are its own)."""
        out = {row: rec for row, rec in self.records.items() if rec}
        self.used.update((row, column) for row in out)
        return out

    def ratio(self, row: str, base: str, column: str) -> float | None:
        """`row` over `base` in `column`, only where both come from one sweep (never across sweeps)."""
        a, b = self.value(row, column), self.value(base, column)
        if a is None or not b or self.rows[row].get("sweep") != self.rows[base].get("sweep"):
            return None
        return a / b

    def doubts(self) -> list[str]:
        """Why a verdict on what was read is only provisional (issue 51): a row read is suspect (its reason:
        suite/records/trust.py), the rows read were measured by more than one code, or a rate read rests on fewer
        than MIN_ROUNDS timing rounds. Counted sections have no rounds."""
        recs = {row: rec for row, _ in sorted(self.used) if (rec := self.records.get(row))}
        out = [f"`{row}` suspect ({rec['suspect']})" for row, rec in recs.items() if rec.get("suspect")]
        labels = set(tables.codes(list(recs.values())).values())  # (not run, pending: no code)
        if len(labels) > 1:
            out.append(f"read from several codes (commits {', '.join(sorted(labels))})")
        thin = sorted(
            {
                f"`{row}` {timing_rounds(recs[row])}"
                for row, column in self.used
                if row in recs and "throughput" in column and tables.thin_rate(recs[row])
            }
        )
        if thin and not self.where.counted:
            out.append(f"fewer than {MIN_ROUNDS} timing rounds ({', '.join(thin)})")
        return out


ANY_CPU = (
    "any CPU"  # Where.machine: the most complete CPU section of the profile, then the newest (never a hand's pick)
)


def _measured_rows(records) -> int:
    return sum(bool(r) and tables.measured(r["status"]) for r in records)


def read(where: Where, results_dir: Path) -> Reading | None:
    """The section `where` of its experiment's table, from the records under `results_dir`; None if it has none.
    Where its machine is ANY_CPU: among the CPU sections of its profile, the one with the most rows measured, then the
    newest (a later sweep on another CPU replaces the one a claim was first read on), named as that machine."""
    exp = get_experiment(where.experiment)
    found = []
    for title, cells, records in tables.sections(exp, results_dir, warn=lambda _: None):
        machine = title.partition(" profile on ")[2].partition(" (")[0]
        if where.machine == ANY_CPU and "(cpu device)" in title:
            if not dataclasses.replace(where, machine=machine).matches(title):
                continue
        elif not where.matches(title):
            continue
        newest = max((str(r.get("finished") or "") for r in records if r), default="")
        found.append(((_measured_rows(records), newest), machine, cells, records))
    if not found:
        return None
    _, machine, cells, records = max(found, key=lambda f: f[0])
    names, rows = tables.table_rows(exp, cells, records)
    by_row = {r[0]: dict(zip(names, r)) for r in rows}
    return Reading(
        dataclasses.replace(where, machine=machine), by_row, {c.row.name: rec for c, rec in zip(cells, records)}
    )
