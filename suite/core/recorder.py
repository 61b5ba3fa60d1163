"""The one place a sweep saves a record: an outcome labelled with its cell, machine and sweep, logged to W&B when
final."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone

from suite.core.experiment import Cell
from suite.core.request import SweepRequest
from suite.records import store, tracking
from suite.records.schema import Outcome, Record


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
            "config": cell.resolved(),
            "machine": self.machine,
            # A reused twin was measured in its own sweep: a ratio against this sweep's rows must not be taken.
            "sweep": (outcome.get("reused_from") or {}).get("sweep") or self.sweep,
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def save(self, cell: Cell, outcome: Outcome, final: bool = False, tag: str = "") -> Record:
        """Label and save `outcome` under this machine. A `final` one is then logged to W&B and saved again with its
        run's folder: saved first, so that a runner killed inside W&B loses no measured cell; a failure there is
        reported under the progress `tag`, and the record stands as saved."""
        record = self.label(cell, outcome)
        if not self._store(record, tag):
            return record
        if final:
            try:
                record["wandb_dir"] = tracking.log_record(
                    record, self.req.wandb_mode, tracking.folder(self.req.results_dir)
                )
            except Exception as exc:  # noqa: BLE001 — tracking must never lose a measured cell
                self.progress(f"{tag or record['row']}: W&B logging failed: {exc}")
                return record
            self._store(record, tag)
        return record

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
