"""The store's migrations: what an earlier suite wrote into a record, brought to what this one keeps, by code and
never by hand. Each migration is a function of a record (and its results folder) that returns what it changed, in
words, or None; `python -m suite migrate` rewrites every record file under results/runs/ that one changes and notes
each change in the record's `migrated` list. The store applies the same migrations in memory when it reads a record
not yet rewritten, so an older folder reads as a migrated one.

- `wandb_dir`: a record keeps the folder of its W&B run relative to the results folder, so that it reads the same
  in any clone (issue 64). An absolute one (records before that rule kept the measuring machine's path) becomes
  relative where that folder lies in this results folder, and is dropped where it does not: a path into another
  machine's working folder names nothing here (the run's W&B id derives from its machine and key)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from suite.config.files import write_atomic


def _wandb_dir(record: dict, results_dir: Path) -> str | None:
    stored = record.get("wandb_dir")
    if not isinstance(stored, str) or not Path(stored).is_absolute():
        return None
    path = Path(stored)
    try:
        inside = path.exists() and path.resolve().relative_to(results_dir.resolve())
    except ValueError:
        inside = None
    if inside:
        record["wandb_dir"] = str(inside)
        return "wandb_dir: an absolute path inside the results folder, kept relative to it"
    del record["wandb_dir"]
    return "wandb_dir: an absolute path on the machine that measured it, naming no folder here: dropped"


MIGRATIONS: dict[str, Callable[[dict, Path], str | None]] = {"wandb-dir-relative": _wandb_dir}


def upgrade(record: dict, results_dir: Path) -> list[str]:
    """Apply every migration to `record` in place; what each changed, in words (none: nothing to migrate)."""
    if not isinstance(record, dict):
        return []
    return [f"{name}: {said}" for name, fn in MIGRATIONS.items() if (said := fn(record, Path(results_dir)))]


def results_root(path: Path) -> Path | None:
    """The results folder a record file lies in: the parent of its `runs` folder (runs/<machine>/[earlier/]<key>)."""
    return next((p.parent for p in Path(path).parents if p.name == "runs"), None)


def migrate(results_dir: Path, today: str) -> list[Path]:
    """Rewrite every record file under `results_dir`/runs that a migration changes, noting in its `migrated` list
    what changed, by what and on `today` (a date); the files rewritten. A file that is not a JSON object is left."""
    written = []
    for path in sorted(Path(results_dir, "runs").rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        notes = upgrade(record, results_dir)
        if not notes:
            continue
        record["migrated"] = [*record.get("migrated", []), *({"on": today, "what": n} for n in notes)]
        write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str))
        written.append(path)
    return written
