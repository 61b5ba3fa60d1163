"""Counts of a campaign's capped cells made before the GPU is lent, and taken there in place of counting again.

A sweep with `precount` counts each capped timed cell first (fake tensors, on the host's cores) and records one
past its cap `oom` without running it (suite.core.runner.counted_past_cap). A count needs no device: the same
count made on a CPU that runs the GPU image's torch and transformers (the mimic environment, `make gpu-precount`)
with the cell as the GPU resolves it (`device=cuda`) is the GPU's count, so it is stored under
results/campaign/precount/ and the GPU's sweep takes it where its code (provenance.code: the count's cell's files,
suite.core.cell_code, as they are there) and both versions match, instead of spending device time on it. Anything
else is counted again there: a count of a cell whose method or harness changed since, never one whose other cells'
methods did.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from suite.config.files import read_object, write_atomic
from suite.core.experiment import Cell
from suite.records.schema import Outcome

FOLDER = Path("campaign") / "precount"


def capped(cells: list[Cell]) -> list[Cell]:
    """The timed cells under a device cap whose count speaks for the device: ours, and a peer whose offload a count
    can bound (Method.count_allowance); any other peer always runs."""
    return [
        c
        for c in cells
        if c.run.device_memory and c.spec.timed and c.method_class is not None
        and c.method_class.count_allowance(c.run) is not None
    ]  # fmt: skip


def as_on_gpu(experiment, only: list[str] | None) -> list[Cell]:
    """An experiment's `paper` cells (`only` rows, or all) as a GPU machine resolves them (`device=cuda`), on any
    machine: the keys its sweep records and its stored counts go by."""
    return experiment.cells("paper", only, ["device=cuda"], None)


def count_of(cell: Cell) -> Cell:
    """The count that stands for `cell` (its key names the stored precount)."""
    return dataclasses.replace(cell, kind="count")


def _path(results_dir: Path, cell: Cell) -> Path:
    return Path(results_dir) / FOLDER / f"{count_of(cell).key}.json"


def save(results_dir: Path, cell: Cell, outcome: Outcome) -> Path:
    """Store `outcome`, the count of `cell`, with the cell it stands for."""
    path = _path(results_dir, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"experiment": cell.experiment, "row": cell.row.name, "cell_key": cell.key, "count_key": count_of(cell).key}
    rec.update({k: outcome.get(k) for k in ("status", "metrics", "error", "provenance", "duration_s")})
    return write_atomic(path, json.dumps(rec, indent=1, default=str))


def load(results_dir: Path, cell: Cell, torch_version: str, transformers_version: str | None) -> Outcome | None:
    """The stored count of `cell` if it was made by its count's code now (provenance.code, suite.core.cell_code) under
    the given torch and transformers, and finished (fits, or `oom`); else None."""
    rec = read_object(_path(results_dir, cell))  # none, or cut short: counted again (and saved whole)
    if rec is None:
        return None
    prov = rec.get("provenance") or {}
    same = (prov.get("torch"), prov.get("transformers")) == (torch_version, transformers_version)
    same = same and prov.get("code") == count_of(cell).code["code"]
    return rec if same and rec.get("status") in ("ok", "oom") else None
