"""The long-lived worker: the same records as fresh processes, bitwise, with each model shape built once; and
the runner's guarantees kept: one status per cell, a dead or timed-out worker's cell recorded, the next cell run."""

import os

import pytest
from test_runner import make_experiment

from suite.core import registry
from suite.core.experiment import Row
from suite.core.launcher import Worker, close_shared_worker, pooled
from suite.core.request import SweepRequest
from suite.sweep import sweep

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _this_machine(monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    yield
    close_shared_worker()  # a worker keeps the environment it started with (the plugins below)


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("SUITE_PLUGINS", "plugin_methods")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    registry.load_plugins()
    import plugin_methods

    plugin_methods.register_again()  # after another test unregistered them
    yield
    for name in ("always-fails", "dies"):
        registry.unregister(name)


def _sweep(tmp_path, rows, worker, **kw):
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", worker=worker, **kw)
    return sweep(req, progress=lambda m: None)


def test_a_worker_gives_the_fresh_processes_records_bitwise_in_one_process(tmp_path):
    rows = [Row("a", "grad_accum"), Row("b", "amp", {"precision": "bf16"}), Row("c", "l2l"), Row("d", "grad_accum")]
    fresh = _sweep(tmp_path / "fresh", rows, worker=False, rounds=1)
    pooled_ = _sweep(tmp_path / "pooled", rows, worker=True, rounds=2)
    assert [r["status"] for r in pooled_] == ["ok"] * 4
    # The losses are bitwise a fresh process's: the pool hands out exact copies with the build's generator state.
    for f, p in zip(fresh, pooled_):
        assert f["metrics"]["final_loss"] == p["metrics"]["final_loss"], f["row"]
    workers = [p["provenance"]["worker"] for p in pooled_]
    again = _sweep(tmp_path / "again", rows[:1], worker=True, rounds=1)[0]["provenance"]["worker"]
    assert again["pid"] == workers[0]["pid"] and again["model_from_pool"]  # the next sweep shares the worker
    assert len({w["pid"] for w in workers}) == 1  # one process for every cell-round
    assert [w["pooled_model"] for w in workers] == [True, True, False, True]  # L2L keeps its host memory its own
    # b copies the model a built (same shape), d builds it again after L2L emptied the pool
    assert [w["model_from_pool"] for w in workers] == [False, True, False, False]
    assert "worker" not in fresh[0]["provenance"]


def test_a_dead_or_failing_cell_is_recorded_and_the_next_runs_in_a_new_worker(tmp_path, plugins):
    rows = [Row("fails", "always-fails"), Row("dies", "dies"), Row("after", "grad_accum")]
    records = _sweep(tmp_path, rows, worker=True, rounds=1)
    assert records[0]["status"].startswith("error: ValueError: deliberate failure")
    assert records[1]["status"] == "oom" and records[1]["error"] is not None  # SIGKILL, as the OOM killer's
    assert records[2]["status"] == "ok"
    assert records[2]["provenance"]["worker"]["pid"] != records[0]["provenance"]["worker"]["pid"]


def test_a_timeout_kills_the_worker_and_is_the_cells_status(tmp_path):
    worker = Worker()
    try:
        cell = make_experiment([Row("a", "grad_accum")]).cells("tiny")[0]
        assert pooled(cell)
        first = worker.run(cell.resolved(), timeout=0.5)  # the import alone takes longer
        assert first["status"] == "timeout" and worker.proc is None
        assert worker.run(cell.resolved(), timeout=120)["status"] == "ok" and worker.started == 2
    finally:
        worker.close()
