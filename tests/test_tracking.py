"""Tests for suite.records.tracking: offline W&B runs are written and read back exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import real_wandb

from suite.records import tracking

_DIR_VARS = (
    "WANDB_DIR",
    "WANDB_CACHE_DIR",
    "WANDB_CONFIG_DIR",
    "WANDB_DATA_DIR",
    "WANDB_ARTIFACT_DIR",
)


def _isolate(mp, root: Path) -> None:
    # Nothing may touch ~/.cache, ~/.config or the real netrc, nor find a real key or mode.
    for var in _DIR_VARS:
        mp.setenv(var, str(root / var.lower()))
    mp.setenv("NETRC", str(root / "no-netrc"))
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        mp.delenv(var, raising=False)


def _teardown_wandb() -> None:
    # The wandb singleton caches settings read from the env and keeps wandb-core alive.
    teardown = getattr(sys.modules.get("wandb"), "teardown", None)  # absent: not the library (an empty folder)
    if teardown is not None:
        teardown()


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    _isolate(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The only two W&B runs of this file: one cell and one table, both offline."""
    real_wandb()  # the tests that read these runs back need wandb itself
    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, root)
        _teardown_wandb()
        try:
            run = tracking.RunPayload(
                rid="exp1-r1",
                name="exp1/r1",
                group="exp1",
                job_type="adamw",
                tags=["method:adamw", "measured"],
                config={**CONFIG, "provenance": PROVENANCE},
                summary={**SUMMARY, "status": "ok"},
                history=HISTORY,
            )
            cell = tracking.log_run(run, mode="offline", dir=str(root / "out"))
            table = tracking.log_table(
                experiment="exp1",
                columns=["row", "method", "loss"],
                rows=[["r1", "adamw", 1.25], ["r2", "sgd", "NA"], ["r3", "sgd", None]],
                mode="offline",
                dir=str(root / "out"),
            )
        finally:
            _teardown_wandb()
    return root, cell, table


HISTORY = [
    {"step": 0, "epoch": 0.0, "dev/accuracy": 50.0},
    {"step": 10, "epoch": 0.5, "train/loss": 0.75, "train/lr": 1e-05, "train/samples_per_s": 120.5},
    {"step": 20, "epoch": 1.0, "train/loss": 0.5, "train/lr": 5e-06, "dev/accuracy": 75.0, "dev/f1": None},
]
CONFIG = {"lr": 0.001, "batch": 8, "opt": {"betas": [0.9, 0.95]}}
PROVENANCE = {"git": "abc123", "host": {"gpu": "H200", "n": 1}}
SUMMARY = {
    "loss": 1.25,
    "peak_mem_gib": 12,
    "note": "fine",
    "diverged": float("nan"),
    "skipped": None,
}


def test_cell_round_trip(runs):
    root, cell, _ = runs
    assert cell is not None and Path(cell).parent.parent == root / "out"
    assert len(list(Path(cell).glob("run-*.wandb"))) == 1
    got = tracking.read_offline_run(cell)
    assert got["config"] == {**CONFIG, "provenance": PROVENANCE}
    # NaN and None are recorded as null, which the reader's summary view omits; W&B keeps each history key's
    # last value in the summary as well.
    last = {"dev/accuracy": 75, "epoch": 1, "train/loss": 0.5, "train/lr": 5e-06, "train/samples_per_s": 120.5}
    assert got["summary"] == {"loss": 1.25, "peak_mem_gib": 12, "note": "fine", "status": "ok", **last}


def test_cell_history_round_trip(runs):
    """A fine-tuning run's history (training points and evaluations by step) reads back from the offline files."""
    _, cell, _ = runs
    assert tracking.read_offline_history(cell) == [{k: v for k, v in r.items() if v is not None} for r in HISTORY]


def test_cell_run_identity(runs):
    _, cell, _ = runs
    exe = Path(sys.executable).with_name("wandb")
    out = subprocess.run(
        [str(exe), "leet", "inspect", "--json", cell],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    run = next(r["run"] for r in map(json.loads, out.stdout.splitlines()) if r["type"] == "run")
    assert (run["project"], run["run_group"], run["job_type"], run["display_name"], run["run_id"]) == (
        tracking.PROJECT,
        "exp1",
        "adamw",
        "exp1/r1",
        "exp1-r1",
    )
    assert run["tags"] == ["method:adamw", "measured"]


def test_table_recorded(runs):
    _, cell, table = runs
    assert table is not None and table != cell
    entry = tracking.read_offline_run(table)["summary"]["exp1"]
    assert entry["_type"] == "table-file" and (entry["nrows"], entry["ncols"]) == (3, 3)
    data = json.loads((Path(table) / "files" / entry["path"]).read_text())
    assert data == {
        "columns": ["row", "method", "loss"],
        "data": [["r1", "adamw", 1.25], ["r2", "sgd", "NA"], ["r3", "sgd", None]],
    }


def test_everything_stays_in_the_given_dirs(runs):
    root, _, _ = runs
    # wandb-core logs go to WANDB_CACHE_DIR, table staging to WANDB_DATA_DIR, runs to `dir`.
    assert {p.name for p in root.iterdir()} <= {"out", *(v.lower() for v in _DIR_VARS)}


def test_off_writes_nothing(env):
    out = env / "off"
    kw = dict(experiment="e", mode="off", dir=str(out))
    run = tracking.RunPayload(rid="r", name="e/r", group="e", job_type="m", tags=[], config={}, summary={})
    assert tracking.log_run(run, mode="off", dir=str(out)) is None
    assert tracking.log_table(columns=["a"], rows=[[1]], **kw) is None
    assert not out.exists() and sorted(p.name for p in env.iterdir()) == []


def test_missing_wandb_warns_once(env, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    monkeypatch.setattr(tracking, "_warned_missing", False)
    for _ in range(2):
        assert tracking.log_table(experiment="e", columns=["a"], rows=[[1]], mode="offline", dir=str(env / "x")) is None
    assert capsys.readouterr().err.count("wandb is not installed") == 1


def test_resolve_mode_invalid_names_modes():
    with pytest.raises(ValueError) as err:
        tracking.resolve_mode("disabled")
    assert all(m in str(err.value) for m in tracking.MODES)


def test_resolve_mode(env, monkeypatch):
    assert tracking.MODES == ("off", "offline", "online")
    for m in tracking.MODES:
        assert tracking.resolve_mode(m) == m
    assert tracking.resolve_mode(None) == tracking.resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert tracking.resolve_mode(None) == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    (env / "no-netrc").write_text("machine api.wandb.ai login user password secret\n")
    os.chmod(env / "no-netrc", 0o600)
    assert tracking.resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert tracking.resolve_mode(None) == "off"
    assert tracking.resolve_mode("offline") == "offline"  # an explicit mode beats WANDB_MODE


def test_a_folder_of_wandb_runs_on_the_path_is_not_the_library(monkeypatch, capsys):
    """Run from the tree without W&B installed (the GPU image), a `wandb/` folder of offline runs imports as an empty
    namespace package: tracking is off and says why, instead of failing on a missing wandb.init."""
    import types

    from suite.records import tracking

    monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))
    monkeypatch.setattr(tracking, "_warned_missing", False)
    assert not tracking.installed()
    assert "an empty `wandb` folder on the path is W&B's runs" in capsys.readouterr().err


def test_the_sync_hint_quotes_its_folder_as_a_shell_takes_it(tmp_path, monkeypatch):
    """A results folder with a space in its name: the printed `wandb sync` runs as pasted (issue 65)."""
    import shlex

    from suite.records import tracking

    monkeypatch.delenv("WANDB_DIR", raising=False)
    line = tracking.said("offline", tmp_path / "my results", 2)
    command = line.split("to upload them: ")[1]
    assert shlex.split(command)[:2] == ["wandb", "sync"] and len(shlex.split(command)) == 3
    assert shlex.split(command)[2] == f"{tmp_path / 'my results' / 'wandb' / 'wandb'}/offline-run-*"
