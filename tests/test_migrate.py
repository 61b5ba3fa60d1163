"""The store's migrations (suite/records/migrate.py, issue 64 item 4): no record keeps an absolute path."""

import json

import pytest

from suite.records import migrate, store, tracking
from suite.records.index import Index

BASE = {
    "key": "k", "experiment": "e", "row": "r", "method": "amp", "profile": "tiny", "device_type": "cpu",
    "variant": "", "config": {"run": {}}, "status": "ok", "metrics": {}, "provenance": {},
    "finished": "2026-11-29T00:00:00", "machine": {"slug": "m"},
}  # fmt: skip


def _write(results, name, record):
    path = results / "runs" / "m" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_an_absolute_wandb_dir_becomes_relative_or_is_dropped_once(tmp_path):
    results = tmp_path / "results"
    run = results / "wandb" / "wandb" / "offline-run-1"
    run.mkdir(parents=True)
    inside = _write(results, "a.json", {**BASE, "key": "a", "wandb_dir": str(run)})
    elsewhere = _write(results, "b.json", {**BASE, "key": "b", "wandb_dir": "/home/someone/work/wandb/offline-run-2"})
    kept = _write(results, "earlier/c.s.json", {**BASE, "key": "c", "wandb_dir": "wandb/wandb/offline-run-3"})
    assert migrate.migrate(results, "2026-11-29") == [inside, elsewhere]
    a, b = json.loads(inside.read_text()), json.loads(elsewhere.read_text())
    assert a["wandb_dir"] == "wandb/wandb/offline-run-1" and "wandb_dir" not in b
    assert b["migrated"] == [{"on": "2026-11-29", "what": "wandb-dir-relative: wandb_dir: an absolute path on the "
                              "machine that measured it, naming no folder here: dropped"}]  # fmt: skip
    assert json.loads(kept.read_text())["wandb_dir"] == "wandb/wandb/offline-run-3"
    assert migrate.migrate(results, "2026-11-30") == []  # done once
    assert tracking.run_path(a, results) == run


def test_an_unmigrated_record_reads_as_a_migrated_one_and_none_is_saved_absolute(tmp_path):
    results = tmp_path / "results"
    _write(results, "b.json", {**BASE, "key": "b", "wandb_dir": "/elsewhere/offline-run-2"})
    (rec,) = Index(results).records()
    assert rec["key"] == "b" and "wandb_dir" not in rec  # read, not measured again
    with pytest.raises(ValueError, match="wandb_dir is absolute"):
        store.save(results, "d", "m", {**BASE, "key": "d", "wandb_dir": "/elsewhere/offline-run-4"})


def test_no_committed_record_holds_an_absolute_path():
    from pathlib import Path

    from suite.records.schema import absolute

    root = Path(__file__).resolve().parent.parent / "results" / "runs"
    held = [p for p in root.rglob("*.json") if absolute(json.loads(p.read_text()).get("wandb_dir"))]
    assert not held, held[:3]
