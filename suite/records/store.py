"""The record store: one JSON record per cell and machine, results/runs/<machine>/<key>.json, written atomically
and checked against the record schema (suite/records/schema.py) when read. It writes and reads one file; what is
asked of the records as a whole is the index's (suite/records/index.py)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.files import write_atomic
from suite.records import migrate
from suite.records.schema import (  # noqa: F401 (FINISHED: here too)
    FINISHED,
    SCHEMA_VERSION,
    Record,
    absolute,
    machine_of,
    newer,
    problems,
)


def run_path(results_dir: Path, key: str, machine: str) -> Path:
    """Where the record of cell `key` measured on `machine` (its slug) lives; a key or slug that is not a plain name
    (a path separator, `..`) is refused: the record would lie elsewhere than its machine's folder."""
    for what, name in (("cell key", key), ("machine", machine)):
        if not paths.plain(name):
            raise ValueError(f"{what} {name!r} is not a plain name (letters, digits, '.', '_', '-'): no record path")
    return results_dir / "runs" / machine / f"{key}.json"


_warned: set[tuple[str, str]] = set()  # (file, warning) said in this process: each once per command


def once(warn: Callable[[str], None], path: Path, line: str) -> None:
    if (str(path), line) not in _warned:
        _warned.add((str(path), line))
        warn(line)


def read(path: Path, warn: Callable[[str], None] = print, once_: bool = True) -> Record | None:
    """The record at `path`, or None with one warning line naming the file (once per file in a command) when it is
    not a readable record or does not match the record schema (suite/records/schema.py). A record a newer suite
    wrote is said to be left untouched: the runner never writes over it (suite.core.plan). `once_=False` says each
    warning every time (the index keeps each line and says it once in a command: suite/records/index.py)."""
    say = (lambda path, line: once(warn, path, line)) if once_ else (lambda path, line: warn(line))
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        say(path, f"warning: {path} is not a readable record ({type(exc).__name__}: {exc}); measured again")
        return None
    if root := migrate.results_root(path):
        migrate.upgrade(rec, root)  # what `python -m suite migrate` would rewrite, read as it would be
    if newer(rec):
        say(path, f"warning: {path} was written by a newer suite (schema {rec['schema']}, this one reads up "
              f"to {SCHEMA_VERSION}): left untouched, not read")  # fmt: skip
        return None
    if wrong := problems(rec) or misplaced(path, rec):
        said = ", ".join(wrong)
        say(path, f"warning: {path} does not match the record schema (suite/records/schema.py: {said}); "
              "measured again")  # fmt: skip
        return None
    return rec


def misplaced(path: Path, rec: Record) -> list[str]:
    """Where a record's content disagrees with its file's place (runs/<machine>/<key>.json, or
    runs/<machine>/earlier/<key>.<sweep>.json): its key or its machine is another's. Such a record is a copy made
    under another name; it is never reused or shown as the cell its path names."""
    path = Path(path)
    kept = path.parent.name == EARLIER
    folder = path.parent.parent if kept else path.parent
    name = f"{rec.get('key')}.{rec.get('sweep')}" if kept else str(rec.get("key"))
    named = path.stem == name or (kept and path.stem.startswith(f"{name}.partial-"))  # (a partial set aside)
    out = [] if named else [f"its key {rec.get('key')!r} is not its file's name {path.stem!r}"]
    if folder.name != "runs" and (slug := machine_of(rec)) != folder.name:  # (a flat record predates machine folders)
        out.append(f"its machine {slug!r} is not its folder's {folder.name!r}")
    return out


def save(results_dir: Path, key: str, machine: str, record: Record) -> Path:
    """Write atomically (a temporary file of its own, renamed), so an interrupted sweep never leaves a half-written
    record and two processes saving one cell each leave a whole one; stamped with the schema's version. A finished
    record of another sweep that this one replaces is kept under EARLIER (the index's `kept`)."""
    global saves
    record = {**record, "schema": SCHEMA_VERSION}
    if absolute(record.get("wandb_dir")):
        raise ValueError(f"record {key}: its wandb_dir is absolute; a record keeps it relative to the results folder")
    path = run_path(results_dir, key, machine)
    try:
        _keep_earlier(path, record)
        return write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str))
    finally:
        saves += 1


saves = 0  # records saved by this process: an index read before a save reads again (suite/records/index.py)
EARLIER = "earlier"  # runs/<machine>/earlier/<key>.<sweep>.json: a cell's finished records of earlier sweeps


def _keep_earlier(path: Path, record: Record) -> None:
    """Keep the record at `path` under EARLIER where `record` is about to replace it and would lose what it holds: an
    `ok` record of another sweep (the rows measured in its sweep keep their ratios to it: a reference row measured
    again beside a re-run of other rows), or a partial one of another code, whose measured rounds the new code's
    record never folds in (kept with a note: nothing measured is dropped)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(old, dict) or newer(old) or not old.get("sweep"):  # another shape, or nothing to name it by
        return
    code = (record.get("provenance") or {}).get("code")
    was = (old.get("provenance") or {}).get("code") if isinstance(old.get("provenance"), dict) else None
    if old.get("status") == "ok" and old["sweep"] != record.get("sweep"):
        kept, text = path.parent / EARLIER / f"{path.stem}.{old['sweep']}.json", path.read_text()
    elif str(old.get("status")).startswith("partial") and old.get("round_records") and was and was != code:
        # (a record of no code, a failure before any round, folded none of these rounds in either)
        kept = path.parent / EARLIER / f"{path.stem}.{old['sweep']}.partial-{was}.json"
        note = f"replaced by a record of code {code} (the rounds of code {was} are never folded into it)"
        text = json.dumps({**old, "set_aside": note}, indent=1, sort_keys=True, default=str)
    else:
        return
    if paths.inside(path.parent / EARLIER, kept) and kept.parent == path.parent / EARLIER:
        write_atomic(kept, text)
    # else: a sweep id that is a path (`x/../..`): the schema refuses that record, kept nowhere, never outside


def writable(results_dir: Path, machine: str) -> None:
    """Refuse, before anything runs, a results folder (`machine`'s own folder in it) this process cannot save a
    record into (a measured round was lost to a PermissionError at its save); nothing is created."""
    here = run_path(results_dir, "k", machine).parent
    while not here.exists() and here != here.parent:  # the folder that saving would write or make folders in
        here = here.parent
    try:
        fd, probe = tempfile.mkstemp(dir=here, prefix=".writable-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"results folder {results_dir} cannot be written ({exc.strerror or exc}): give SUITE_RESULTS_DIR a folder "
            "this user can write"
        ) from None
