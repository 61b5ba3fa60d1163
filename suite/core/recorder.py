"""The one place a sweep saves a record: an outcome labelled with its cell, machine and sweep."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from suite.core.experiment import Cell
from suite.core.plan import due
from suite.core.request import SweepRequest
from suite.core.rounds import comparable, merge
from suite.records import store
from suite.records.schema import Outcome, Record, failed, status_of


class Recorder:
    """Saves the records of one sweep on one machine (`fingerprint`, suite.measure.machine)."""

    def __init__(self, req: SweepRequest, fingerprint: dict, sweep: str, progress: Callable[[str], None]):
        self.req, self.machine, self.sweep, self.progress = req, fingerprint, sweep, progress

    def label(self, cell: Cell, outcome: Outcome) -> Record:
        """`outcome` with its cell, machine and sweep: the record as it is saved."""
        return {
            **outcome,
            "key": cell.key,
            "experiment": self.req.experiment.name,
            "row": cell.row.name,
            "method": cell.run.method,  # what ran: a variant's (--set method=...) where it set one
            "profile": self.req.profile,
            "device_type": cell.run.device,
            "variant": self.req.variant,
            "settings": self.req.settings,  # the flags that reproduce it (a printed re-run command carries them)
            "config": cell.resolved(),
            "machine": self.machine,
            # A reused twin was measured in its own sweep: a ratio against this sweep's rows must not be taken.
            "sweep": (outcome.get("reused_from") or {}).get("sweep") or self.sweep,
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def save(self, cell: Cell, outcome: Outcome, tag: str = "") -> Record:
        """Label and save `outcome` under this machine (its W&B run is written at the sweep's end, from the records
        saved: suite.commands.sweep)."""
        record = self.label(cell, outcome)
        self._store(record, tag)
        return record

    def record(self, cr: CellRounds, tag: str) -> Record:
        """The record of `cr`'s rounds so far, saved (final once complete or failed); under --force, a partial one
        is only labelled where the cell's earlier record stands until this one is complete."""
        merged = cr.merged()
        final = status_of(merged).kind != "partial"
        if not final and cr.keeps_earlier:
            return self.label(cr.cell, merged)
        record = self.save(cr.cell, merged, tag)
        cr.replaced = cr.replaced or final
        return record

    def interrupted(self, cr: CellRounds, tag: str) -> None:
        """An interrupt discarded `cr`'s running round: its finished rounds are saved as a partial record (in this
        sweep, which the same command resumes), but under --force over no earlier record of its own (that stands
        until its replacement is complete); a cell with none keeps whatever record it had."""
        kept = [r for r in cr.done if r["status"] == "ok"]
        if kept and len(kept) < cr.planned and not cr.keeps_earlier:  # (all done: saved final)
            self.save(cr.cell, cr.merged(kept), tag=tag)

    def hold(self, cells: Iterable[CellRounds], why: str) -> None:
        """Save each cell that has not measured a round yet and has no record of its own as `pending: <why>` in this
        sweep, so that the call which runs it joins the sweep (suite.core.plan) and its ratios hold. A record there
        before (finished, partial, an error) is never written over: such a cell joins the sweep through the cells
        this call did record (their partial records), or, where there are none, is measured in a new sweep."""
        for cr in cells:
            if not cr.done and not cr.own:
                self.save(cr.cell, failed(f"pending: {why}"))

    def _store(self, record: Record, tag: str) -> bool:
        """Save `record`; where that fails (a full disk, a folder made read-only mid-sweep), one line naming the file
        and the error, with the measured figures, so that nothing measured is lost from sight; the sweep goes on."""
        try:
            store.save(self.req.results_dir, record["key"], self.machine["slug"], record)
            return True
        except OSError as exc:
            path = store.run_path(self.req.results_dir, record["key"], self.machine["slug"])
            figures = json.dumps(record.get("metrics") or {}, sort_keys=True, default=str)
            self.progress(
                f"{tag or record['row']}: could not save {path} ({exc}); {record['status']}, figures: {figures}"
            )
            return False


class CellRounds:
    """One cell's rounds in a sweep, and the rules for what is saved of them: the rounds resumed and run (`done`),
    those of another path set aside (`aside`), whether the cell had a record of its own here before this call
    (`own`) and whether, under --force, its complete new record has replaced that one (`replaced`). The recorder
    saves through it (Recorder.record, hold, interrupted): the runner only runs rounds and reports them."""

    def __init__(self, cell: Cell, planned: int, resumed: list[Outcome], aside: list[dict], own: bool, force: bool):
        self.cell, self.planned, self.force, self.own = cell, planned, force, own
        self.done = list(resumed)
        self.aside = list(aside)
        self.replaced = False

    def due(self, r: int) -> bool:
        """Whether the cell runs a round in pass `r` (plan.due: one whose rounds of another path were set aside
        makes them up in the passes after the last), and none failed."""
        making_up = bool(self.aside)  # only rounds set aside are made up past the last pass
        failed_before = bool(self.done) and self.done[-1]["status"] != "ok"
        return due(len(self.done), self.planned, r, making_up) and not failed_before

    @property
    def final(self) -> bool:
        return bool(self.done) and (len(self.done) >= self.planned or self.done[-1]["status"] != "ok")

    @property
    def keeps_earlier(self) -> bool:
        """Whether the earlier record stands until the new one is complete: under --force, where the cell has one
        (a forced sweep cut short must not leave a partial record, or none, where a finished one was)."""
        return self.force and self.own and not self.replaced

    @property
    def in_full(self) -> bool:
        """Under --force, whether this call measured the cell again in full."""
        return not self.keeps_earlier and (self.own or self.final)

    def merged(self, rounds: list[Outcome] | None = None) -> Outcome:
        """The record of `rounds` (all done so far), with the rounds set aside kept in its metrics (a partial
        record resumed later keeps them)."""
        merged = merge(self.done if rounds is None else rounds, self.planned)
        if not self.aside:
            return merged
        return {**merged, "metrics": {**merged["metrics"], "rounds_set_aside": self.aside}}

    def take(self, outcome: Outcome) -> str | None:
        """Add a round. No silent choice between rounds of different paths (the code, or the harness: dropout
        path, attention kernel, LAMB kernel): a round whose path differs from the cell's rounds before it sets those
        aside (their figures kept in the record's `rounds_set_aside`, out of its median), and the cell is measured
        again under this round's path in the passes that follow; a cell whose path changes a second time is an
        error naming both paths (its figures those of the second path's rounds). Returns the line to report where
        rounds were set aside."""
        before = [r for r in self.done if r["status"] == "ok"]
        if outcome["status"] != "ok" or not before or comparable(before[-1]) == comparable(outcome):
            self.done.append(outcome)
            return None
        paths = f"{path_of(before[-1])}, then {path_of(outcome)}"
        aside_before = len(self.aside)
        kept = ("throughput", "memory_gb")
        self.aside.extend({"path": path_of(r), **{k: r["metrics"].get(k) for k in kept}} for r in before)
        if aside_before:  # set aside before: the path changed twice
            self.done.append(failed(f"error: its rounds took different paths twice ({paths})", outcome.get("error")))
            return None
        self.done = [outcome]
        return f"{len(before)} earlier round(s) ran another path ({paths}): set aside, measured again"


def path_of(outcome: Outcome) -> str:
    """A round's path as its record states it: the code's digest and the harness's paths, e.g. `code 1a2b3c4d;
    dropout hash_triton, attention_triton (tuned); host_lamb fused`."""
    prov = outcome.get("provenance") or {}
    parts = [f"code {str(prov['code'])[:8]}"] if prov.get("code") else []
    for name, taken in sorted((prov.get("harness") or {}).items()):
        if isinstance(taken, dict):
            taken = ", ".join(f"{k} ({v})" if v else str(k) for k, v in sorted(taken.items()))
        parts.append(f"{name} {taken}")
    return "; ".join(parts) or "no path recorded"
