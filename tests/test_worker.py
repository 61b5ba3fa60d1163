"""The long-lived worker: the same records as fresh processes, bitwise, with each model shape built once; and
the runner's guarantees kept: one status per cell, a dead or timed-out worker's cell recorded, the next cell run."""

import os

import pytest
from test_runner import make_experiment

from suite.core import registry
from suite.core.experiment import Row
from suite.core.request import SweepRequest
from suite.core.schedule import by_shape, pooled
from suite.core.worker_client import Worker, close_shared_worker
from suite.sweep import sweep

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _this_machine(monkeypatch):
    close_shared_worker()  # one another test file left: it has that test's environment and job count
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
    wide = {"model.hidden": 64}  # another shape: its cells grouped together in each round
    rows = [
        Row("a", "grad_accum"),
        Row("w", "grad_accum", wide),
        Row("b", "amp", {"precision": "bf16"}),
        Row("c", "l2l"),
        Row("p", "fsdp-offload", {"recompute": "on"}),  # a peer whose library leaves no state behind
    ]
    fresh = _sweep(tmp_path / "fresh", rows, worker=False, rounds=1)
    pooled_ = _sweep(tmp_path / "pooled", rows, worker=True, rounds=2)
    assert [r["status"] for r in pooled_] == ["ok"] * len(rows)
    # The losses are bitwise a fresh process's: the pool hands out exact copies with the build's generator state,
    # and the peer's one-rank process group is left after each cell and joined again by the next.
    for f, p in zip(fresh, pooled_):
        assert f["metrics"]["final_loss"] == p["metrics"]["final_loss"], f["row"]
    workers = {p["row"]: p["provenance"]["worker"] for p in pooled_}
    again = _sweep(tmp_path / "again", rows[:1], worker=True, rounds=1)[0]["provenance"]["worker"]
    assert again["pid"] == workers["a"]["pid"]  # the next sweep shares the worker
    assert len({w["pid"] for w in workers.values()}) == 1  # one process for every cell-round
    # Round 1 (a record keeps its first round's provenance): the tiny shape built once and copied for every other
    # cell of it, L2L and the peer among them, then the wide one; round 2 runs the groups backwards, so that it
    # ends with the tiny shape, which the next sweep's cell finds in the pool.
    assert not workers["a"]["model_from_pool"] and not workers["w"]["model_from_pool"]
    assert all(workers[r]["model_from_pool"] for r in "bcp")
    first = workers["a"]["job"]
    assert [workers[r]["job"] for r in "abcpw"] == list(range(first, first + 5))
    assert again["job"] == first + 10 and again["model_from_pool"]
    assert "worker" not in fresh[0]["provenance"]


def test_a_round_groups_its_cells_by_shape_and_alternates_the_groups():
    exp = make_experiment([Row("a", "grad_accum"), Row("w", "grad_accum", {"model.hidden": 64}), Row("b", "amp")])
    cells = exp.cells("tiny", None, None, None)
    assert [c.row.name for c in by_shape(cells, 1)] == ["a", "b", "w"]
    assert [c.row.name for c in by_shape(cells, 2)] == ["w", "a", "b"]
    assert pooled(next(c for c in exp.cells("tiny", None, ["method=fsdp-offload"], None)))
    assert not pooled(next(c for c in exp.cells("tiny", None, ["method=deepspeed-offload"], None)))


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
