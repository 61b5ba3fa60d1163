"""The record store: one JSON record per cell and machine, results/runs/<machine>/<key>.json, written atomically
and checked against the record schema (suite/records/schema.py) when read. It writes and reads one file; what is
asked of the records as a whole is the index's (suite/records/index.py)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from suite.config.errors import ConfigError
from suite.config.files import write_atomic
from suite.records import migrate
from suite.records.schema import (  # noqa: F401 (FINISHED: here too)
    FINISHED,
    SCHEMA_VERSION,
    Record,
    absolute,
    newer,
    problems,
)


def run_path(results_dir: Path, key: str, machine: str) -> Path:
    """Where the record of cell `key` measured on `machine` (its slug) lives."""
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
    if wrong := problems(rec):
        said = ", ".join(wrong)
        say(path, f"warning: {path} does not match the record schema (suite/records/schema.py: {said}); "
              "measured again")  # fmt: skip
        return None
    return rec


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
        _keep_earlier(path, record.get("sweep"))
        return write_atomic(path, json.dumps(record, indent=1, sort_keys=True, default=str))
    finally:
        saves += 1


saves = 0  # records saved by this process: an index read before a save reads again (suite/records/index.py)
EARLIER = "earlier"  # runs/<machine>/earlier/<key>.<sweep>.json: a cell's finished records of earlier sweeps


def _keep_earlier(path: Path, sweep: str | None) -> None:
    """Keep the `ok` record at `path` if a record of another sweep is about to replace it: the rows measured in its
    sweep keep their ratios to it (a reference row measured again beside a re-run of other rows)."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(old, dict):  # valid JSON of another shape (`[]`, `42`): nothing to keep, it is replaced
        return
    if old.get("status") == "ok" and old.get("sweep") and old["sweep"] != sweep and not newer(old):
        write_atomic(path.parent / EARLIER / f"{path.stem}.{old['sweep']}.json", path.read_text())


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
