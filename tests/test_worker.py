"""The long-lived worker: the same records as fresh processes, bitwise, with each model shape built once; and
the runner's guarantees kept: one status per cell, a dead or timed-out worker's cell recorded, the next cell run."""

import os

import pytest
from test_runner import make_experiment

from suite.commands.sweep import sweep
from suite.core import registry
from suite.core.experiment import Row
from suite.core.request import SweepRequest
from suite.core.schedule import by_shape, pooled
from suite.core.worker_client import Worker, close_shared_worker

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
    for name in ("always-fails", "dies", "unsettles", "patches-linear", "declares-patch"):
        registry.unregister(name)


def _sweep(tmp_path, rows, worker, **kw):
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", worker=worker, **kw)
    return sweep(req, progress=lambda m: None)


WIDE = {"model.hidden": 64}  # another shape: its cells grouped together in each round
# fp32, fp16 and bf16 cells of two shapes in turn, L2L and a peer: what a campaign's worker runs one after another.
ISOLATION_ROWS = [
    Row("a", "grad_accum"),
    Row("w", "grad_accum", WIDE),
    Row("h", "amp", {"precision": "fp16"}),
    Row("hw", "amp", {"precision": "fp16", **WIDE}),
    Row("b", "amp", {"precision": "bf16"}),
    Row("bw", "amp", {"precision": "bf16", **WIDE}),
    Row("c", "l2l"),
    Row("p", "fsdp-offload", {"recompute": "on"}),  # a peer whose library leaves no state behind
]


def test_a_worker_gives_the_fresh_processes_records_bitwise_in_one_process(tmp_path):
    """Isolation proven, not assumed: each cell in the worker records what it records in a fresh process, whatever
    ran before it: the same kernel paths, the same final loss (bitwise) and the same counted memory."""
    rows = ISOLATION_ROWS
    fresh = _sweep(tmp_path / "fresh", rows, worker=False, rounds=1)
    pooled_ = _sweep(tmp_path / "pooled", rows, worker=True, rounds=1)
    assert [r["status"] for r in pooled_] == ["ok"] * len(rows)
    # The losses are bitwise a fresh process's: the pool hands out exact copies with the build's generator state,
    # and the peer's one-rank process group is left after each cell and joined again by the next.
    for f, p in zip(fresh, pooled_):
        assert f["metrics"]["final_loss"] == p["metrics"]["final_loss"], f["row"]
        assert f["provenance"]["harness"] == p["provenance"]["harness"], f["row"]  # paths taken, the host LAMB's
        for m in ("memory_gb", "pinned_host_peak_gb"):  # the live-bytes tracker's count (the host peak holds the pool)
            assert f["metrics"].get(m) == p["metrics"].get(m), (f["row"], m)
    workers = {p["row"]: p["provenance"]["worker"] for p in pooled_}
    again = _sweep(tmp_path / "again", rows[:1], worker=True, rounds=1)[0]["provenance"]["worker"]
    assert again["pid"] == workers["a"]["pid"]  # the next sweep shares the worker
    assert len({w["pid"] for w in workers.values()}) == 1  # one process for every cell-round
    # The tiny shape built once and copied for every other cell of it, L2L and the peer among them, then the wide
    # one (test_a_round_groups_its_cells_by_shape_and_alternates_the_groups: the order of later rounds).
    assert not workers["a"]["model_from_pool"] and not workers["w"]["model_from_pool"]
    assert all(workers[r]["model_from_pool"] for r in ("h", "b", "c", "p", "hw", "bw"))
    first = workers["a"]["job"]
    tiny_then_wide = ("a", "h", "b", "c", "p", "w", "hw", "bw")
    assert [workers[r]["job"] for r in tiny_then_wide] == list(range(first, first + 8))
    assert again["job"] == first + 8
    assert "worker" not in fresh[0]["provenance"]


def test_a_round_groups_its_cells_by_shape_and_alternates_the_groups():
    exp = make_experiment([Row("a", "grad_accum"), Row("w", "grad_accum", {"model.hidden": 64}), Row("b", "amp")])
    cells = exp.cells("tiny", None, None, None)
    assert [c.row.name for c in by_shape(cells, 1)] == ["a", "b", "w"]
    assert [c.row.name for c in by_shape(cells, 2)] == ["w", "a", "b"]
    assert pooled(exp.cells("tiny", ["w"], ["method=fsdp-offload"], None)[0])  # (the reference row keeps its own)
    assert not pooled(exp.cells("tiny", ["w"], ["method=deepspeed-offload"], None)[0])


def test_a_dead_or_failing_cell_is_recorded_and_the_next_runs_in_a_new_worker(tmp_path, plugins):
    rows = [Row("fails", "always-fails"), Row("dies", "dies"), Row("after", "grad_accum")]
    records = _sweep(tmp_path, rows, worker=True, rounds=1)
    assert records[0]["status"].startswith("error: ValueError: deliberate failure")
    assert records[1]["status"].startswith("error: worker killed by SIGKILL")  # no OOM kill counted: not `oom`
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


def test_a_cell_that_changes_torchs_process_settings_leaves_the_next_cell_untouched(tmp_path, plugins):
    """torch's threads, FP32 matmul precision, TF32 and default dtype, changed by one cell and left so, go back to the
    worker's own before the next cell: that cell records what a fresh process records."""
    rows = [Row("u", "unsettles"), Row("a", "grad_accum")]
    fresh = _sweep(tmp_path / "fresh", rows[1:], worker=False, rounds=1)[0]
    _, pooled_ = _sweep(tmp_path / "pooled", rows, worker=True, rounds=1)
    assert pooled_["provenance"]["worker"]["job"] == 2  # after the unsettling cell, in the same process
    assert pooled_["provenance"]["threads"] == fresh["provenance"]["threads"]
    assert pooled_["metrics"]["final_loss"] == fresh["metrics"]["final_loss"]


def test_a_cell_records_only_the_host_lamb_it_asked_for():
    """What a worker runs, in one process: a LAMB cell (its optimizer asks for the host's fused kernel), then an
    AdamW cell, which asks for nothing: its record must not claim the first cell's kernel. The H200's isolation test
    (2026-11-27) found a worker's FP32 cell recording `host_lamb: fused` after an L2L-CMP cell: the status was the
    process's, not the cell's."""
    import dataclasses

    from suite.config.run import RunConfig
    from suite.core.cell import execute

    def payload(optimizer):
        run = dataclasses.replace(RunConfig(), method="grad_accum", optimizer=optimizer, seq_len=16, steps=1, warmup=0)
        run = dataclasses.replace(run, micro_batch_size=2, model=dataclasses.replace(run.model, layers=1, hidden=32))
        return {"run": run.validate().to_dict(), "kind": "throughput", "profile": "tiny"}

    lamb, adamw = execute(payload("lamb")), execute(payload("adamw"))
    assert lamb["status"] == adamw["status"] == "ok", (lamb["error"], adamw["error"])
    assert lamb["provenance"]["harness"]["host_lamb"] == "fused"
    assert "host_lamb" not in adamw["provenance"]["harness"], adamw["provenance"]["harness"]


def test_a_cell_after_one_that_patched_a_library_runs_in_a_fresh_process(tmp_path, plugins):
    """A plugin that replaced torch.nn.Linear.forward slowed the next `grad_accum` cell in the same worker, and the
    slowed figure was recorded. The worker now proves it is as a fresh process before each cell, or the cell runs in
    a fresh one, and its record says why; a method that declares it patches globals ends its worker."""
    rows = [Row("patch", "patches-linear"), Row("after", "grad_accum")]
    fresh = _sweep(tmp_path / "fresh", rows[1:], worker=False, rounds=1)[0]
    patched, after = _sweep(tmp_path / "pooled", rows, worker=True, rounds=1)
    worker = after["provenance"]["worker"]
    assert worker["pid"] != patched["provenance"]["worker"]["pid"] and worker["job"] == 1
    assert worker["fresh_because"] == ["torch.nn.modules.linear.Linear.forward is _slow_linear (plugin_methods.py)"], (
        worker
    )
    assert after["metrics"]["final_loss"] == fresh["metrics"]["final_loss"]
    declared, after = _sweep(tmp_path / "declared", [Row("d", "declares-patch"), rows[1]], worker=True, rounds=1)
    assert after["provenance"]["worker"]["pid"] != declared["provenance"]["worker"]["pid"]
    assert after["provenance"]["worker"]["job"] == 1 and "fresh_because" not in after["provenance"]["worker"]
