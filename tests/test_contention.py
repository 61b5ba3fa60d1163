"""A busy machine is measured and shown, never silent: cells timed under load are `contended`, their rates' ratios
are not printed, the run names them, and `--strict` fails on them."""

import subprocess
import sys

import pytest
from test_trust import _cell, make_experiment

from suite.commands import cli
from suite.commands.sweep import sweep
from suite.core.experiment import Row
from suite.core.request import SweepRequest
from suite.core.rounds import merge
from suite.measure import contention

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def busy():
    """One spinning process per usable core, each in a session of its own (another user's job, to the cell)."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin, start_new_session=True) for _ in range(contention.usable_cores())]
    yield
    for p in procs:
        p.kill()
        p.wait()


def _spin_for(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_watch_over_a_loaded_machine_sees_the_others(busy):
    with contention.Watch() as watch:
        _spin_for(1.0)
    c = watch.finish([1.0])
    assert c["contended"], c
    assert c["others_cores"] > 0.5 and any(r.startswith(("other processes", "load")) for r in c["reasons"])


def test_a_step_far_slower_than_the_median_or_rounds_far_apart_are_contended():
    with contention.Watch() as watch:
        pass
    spread = watch.finish([0.1, 0.1, 0.5])
    assert spread["step_spread"] == 5.0 and any(r.startswith("spread") for r in spread["reasons"])
    one_slow = watch.finish([0.1, 0.1, 0.11, 0.1, 0.1, 0.1, 0.9])  # a collection: the median stands
    assert one_slow["step_spread"] < 1.2 and not any(r.startswith("spread") for r in one_slow["reasons"])
    calm = {"contended": False, "reasons": []}
    rounds = [
        {"status": "ok", "metrics": {"throughput": tp, "contention": calm}, "provenance": {}} for tp in (3.45, 308.7)
    ]
    merged = merge(rounds, planned=2)["metrics"]["contention"]
    assert merged["contended"] and merged["reasons"] == ["rounds: their rates lie 89.5x apart"]


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_a_loaded_machine_marks_the_cells_and_suppresses_their_rate_ratios(tmp_path, monkeypatch, busy):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])
    said = []
    req = SweepRequest(
        exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1, overrides=["steps=40"], worker=True
    )
    records = sweep(req, progress=said.append)
    assert all(r["metrics"]["contention"]["contended"] for r in records), [r["metrics"]["contention"] for r in records]
    assert _cell(tmp_path, "b", "status") == "ok, contended"
    assert _cell(tmp_path, "b", "throughput ratio to a, ours") == "—"  # a rate's ratio: not shown
    assert _cell(tmp_path, "b", "memory ratio to a, ours").endswith("x")  # memory's stands
    md = (tmp_path / "trust-test.md").read_text()
    (note,) = [ln for ln in md.splitlines() if ln.startswith("`contended` (`a`, `b`): the machine was busy")]
    assert len(note) < 500 and "<summary>why each is contended (2 rows)</summary>" in md  # the details folded
    (line,) = [m for m in said if m.startswith("contended")]
    assert line.endswith("--profile tiny --set steps=40 --contended")  # one short command, the rows its own
    again = []  # the same command again: each cached line says the record was contended
    sweep(req, progress=again.append)
    cached = [m for m in again if "(cached on m," in m]
    assert len(cached) == 2 and all("contended: no rate ratio shown" in m for m in cached), again


def test_strict_fails_on_a_contended_cell(monkeypatch):
    record = {"status": "ok", "metrics": {"contention": {"contended": True, "reasons": ["load"]}}}
    monkeypatch.setattr("suite.commands.sweep.sweep", lambda req: [record])
    assert cli.main(["run", "table2", "--profile", "tiny", "--wandb", "off"]) == 0
    assert cli.main(["run", "table2", "--profile", "tiny", "--wandb", "off", "--strict"]) == 1
