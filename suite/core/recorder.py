"""The one place a sweep saves a record: an outcome labelled with its cell, machine and sweep, logged to W&B when
final."""

from __future__ import annotations

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
            "method": cell.row.method,
            "profile": self.req.profile,
            "device_type": cell.run.device,
            "variant": self.req.variant,
            "config": cell.resolved(),
            "machine": self.machine,
            "sweep": self.sweep,
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }

    def save(self, cell: Cell, outcome: Outcome, tracked_as: str | None = None) -> Record:
        """Label and save `outcome` under this machine; `tracked_as` (a progress tag): a final record, logged to
        W&B first (a failure there is reported under the tag, and the record is saved all the same)."""
        record = self.label(cell, outcome)
        try:
            if tracked_as is not None:
                record["wandb_dir"] = tracking.log_record(record, self.req.wandb_mode)
        except Exception as exc:  # noqa: BLE001 — tracking must never lose a measured cell
            self.progress(f"{tracked_as}: W&B logging failed: {exc}")
        finally:
            store.save(self.req.results_dir, cell.key, self.machine["slug"], record)
        return record
