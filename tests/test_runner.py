"""The runner: one status per cell, failures recorded without stopping the sweep, resume, W&B read-back."""

import json
import os

import pytest
from conftest import real_wandb

from suite.commands.sweep import sweep
from suite.core import registry
from suite.core.experiment import Experiment, Metric, Row
from suite.core.request import SweepRequest
from suite.records import store, tracking

TESTS = os.path.dirname(os.path.abspath(__file__))
TINY = {
    "model.layers": 1,
    "model.hidden": 32,
    "model.heads": 2,
    "model.intermediate": 64,
    "seq_len": 8,
    "micro_batch_size": 2,
    "num_micro_batches": 2,
    "warmup": 0,
    "steps": 1,
}


def make_experiment(rows):
    return Experiment(
        name="runner-test",
        title="runner test",
        source="tests",
        baseline=rows[0].name,
        metrics=[Metric("throughput", "throughput"), Metric("memory_gb", "memory")],
        label_columns=["precision"],
        rows=lambda profile: rows,
        base=lambda profile: TINY,
        timeout=lambda profile: 120.0,
    )


@pytest.fixture(autouse=True)
def _this_machine(monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setenv("SUITE_PLUGINS", "plugin_methods")
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    registry.load_plugins()  # always-fails in this process too
    import plugin_methods

    plugin_methods.register_again()  # after another test unregistered them

    yield
    registry.unregister("always-fails")


def test_failures_are_recorded_and_the_sweep_goes_on(tmp_path, plugins, wandb_sandbox):
    exp = make_experiment(
        [
            Row("ok", "grad_accum", labels={"precision": "FP32"}, paper={"throughput": 10.0, "memory_gb": 1.0}),
            Row("error", "always-fails"),
            Row("oom", "grad_accum", {"device_memory": "1KiB"}),
            Row("missing", "not-a-method-yet"),
        ]
    )
    records = sweep(
        SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="offline", rounds=1), progress=lambda m: None
    )
    status = {r["row"]: r["status"] for r in records}
    assert status["ok"] == "ok"
    assert status["error"].startswith("error: ValueError: deliberate failure")
    assert status["oom"] == "oom"
    assert status["missing"] == "not_implemented"
    ok = records[0]
    assert ok["metrics"]["throughput"] > 0 and ok["provenance"]["torch"]
    assert "Traceback" in records[1]["error"]
    # every cell is on disk, keyed by its config hash, and the table shows all four rows
    for r in records:
        assert json.loads(store.run_path(tmp_path, r["key"], "test-machine").read_text())["status"] == r["status"]
    table = (tmp_path / "runner-test.md").read_text()
    for word in ("| ok", "error: ValueError", "| oom |", "not_implemented", "| 10.0 |"):
        assert word in table
    assert (tmp_path / "runner-test.csv").read_text().count("\n") == 5


def test_an_ok_cell_leaves_an_offline_wandb_run(tmp_path, wandb_sandbox):
    real_wandb()  # without it (the GPU image) the sweep above runs untracked
    exp = make_experiment([Row("ok", "grad_accum", labels={"precision": "FP32"})])
    (ok,) = sweep(
        SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="offline", rounds=1), progress=lambda m: None
    )
    assert ok["status"] == "ok"
    # the offline W&B run of the ok cell carries its config and summary
    back = tracking.read_offline_run(str(tracking.run_path(ok, tmp_path)))
    assert back["config"]["row"] == "ok" and back["config"]["experiment"] == "runner-test"
    # what a comparison filters on: the machine, the sweep, the commit, and whether the machine was busy
    assert back["config"]["machine"] == ok["machine"]["slug"] and back["config"]["sweep"] == ok["sweep"]
    assert back["config"]["commit"] == ok["provenance"]["commit"]
    assert back["summary"]["contended"] == ok["metrics"]["contention"]["contended"]
    # one table run for the sweep, with its config; a call that measures nothing adds none
    runs = tracking.run_path(ok, tmp_path).parent  # where this process's W&B puts its offline runs
    tables = sorted(runs.glob(f"*run-*-table-runner-test-{ok['sweep']}"))
    assert len(tables) == 1, tables
    config = tracking.read_offline_run(str(tables[0]))["config"]
    assert (config["machine"], config["sweep"], config["profile"]) == (ok["machine"]["slug"], ok["sweep"], "tiny")
    before = set(runs.glob("*run-*-table-runner-test-*"))
    sweep(SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="offline", rounds=1), lambda m: None)
    assert set(runs.glob("*run-*-table-runner-test-*")) == before
    assert back["summary"]["status"] == "ok"
    assert back["summary"]["throughput"] == pytest.approx(ok["metrics"]["throughput"])


def test_timeout_is_a_status(tmp_path):
    exp = make_experiment([Row("slow", "grad_accum")])
    (rec,) = sweep(
        SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="off", timeout=0.5, rounds=1),
        progress=lambda m: None,
    )
    assert rec["status"] == "timeout"


# make test-slow; the default run resumes an interrupted sweep through the CLI (tests/test_interrupts.py)
@pytest.mark.slow
def test_interrupted_sweep_resumes_without_rerunning_finished_cells(tmp_path):
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])

    def interrupt_after_first(msg):
        if ": ok in" in msg:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(
            SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="off", rounds=1),
            progress=interrupt_after_first,
        )
    saved = {
        r["row"]: (p, r)
        for p in (tmp_path / "runs" / "test-machine").glob("*.json")
        for r in [json.loads(p.read_text())]
    }
    assert saved["a"][1]["status"] == "ok" and saved["b"][1]["status"].startswith("pending: interrupted before it ran")
    assert saved["b"][1]["sweep"] == saved["a"][1]["sweep"]  # held in the sweep, which the same command goes on with
    first = [saved["a"][0]]
    stamp = first[0].stat().st_mtime_ns
    seen = []
    records = sweep(
        SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=seen.append
    )
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert records[1]["sweep"] == saved["a"][1]["sweep"]
    assert any("a (grad_accum, tiny): ok (cached on test-machine" in m for m in seen)
    assert first[0].stat().st_mtime_ns == stamp
    # --force runs it again
    sweep(
        SweepRequest(exp, "tiny", ["a"], force=True, results_dir=tmp_path, wandb_mode="off", rounds=1),
        progress=lambda m: None,
    )
    assert first[0].stat().st_mtime_ns != stamp


def test_a_cell_counted_past_its_cap_is_recorded_oom_without_running(tmp_path):
    """Table 5 at tiny caps the device at 10 MiB: the baseline at 64 layers counts past it and is not run, L2L with
    its stash on the host fits and runs; a peer is never skipped on its count (docs/counting.md)."""
    from suite.core.experiment import get_experiment

    seen = []
    req = SweepRequest(
        get_experiment("table5"),
        "tiny",
        only=["baseline-x16", "stash-cpu-x1"],
        results_dir=tmp_path,
        wandb_mode="off",
        rounds=1,
        precount=True,
        overrides=["steps=1", "warmup=0"],
    )
    skipped, ran = sweep(req, progress=seen.append)
    assert skipped["status"] == "oom" and skipped["metrics"]["memory_kind"].startswith("counted")
    assert "not run: its count passed the 10MiB device cap" in skipped["error"]
    assert ran["status"] == "ok"
    assert not any("baseline-x16" in m and "running" in m for m in seen)
    assert any("stash-cpu-x1" in m and "running" in m for m in seen)


def test_a_cell_whose_count_needs_more_host_than_this_one_has_is_recorded_oom_without_running(monkeypatch):
    """Issue 54, item 7: on an accelerator a row whose counted host peak (L2L's param server) or whose offload (a
    peer's count_allowance) passes the host's RAM, less the reserve for what a count does not see, is refused by its
    count before it starts, never left to the kernel's OOM killer; where the host has the room it runs."""
    from suite.core import runner
    from suite.core.experiment import get_experiment

    cells = get_experiment("decoder-8b").cells("tiny", ["8b-l2l-cmp", "8b-fsdp"], ["device=cuda"], None)
    # Their counts as a count reports them (tests/test_counting.py checks the figures): L2L's host apart, 5 MB
    counts = {"l2l-cmp": {"host_peak_bytes": 5_000_000}, "fsdp-offload": {"count_allowance_gb": 0.01}}
    monkeypatch.setattr(
        runner.launcher,
        "run_cell",
        lambda c, timeout: {"status": "ok", "metrics": counts[c.run.method], "error": None, "provenance": {}},
    )
    monkeypatch.setattr(runner.host, "ram_bytes", lambda: runner.HOST_RESERVE + 2**20)
    refused = runner.counted_past_cap(cells, None, lambda m: None)
    assert set(refused) == {c.key for c in cells}
    for outcome in refused.values():
        assert outcome["status"] == "oom" and "GiB of host memory, past the 0.0 GiB" in outcome["error"]
        assert "past the host, not run" in outcome["metrics"]["memory_kind"]
    monkeypatch.setattr(runner.host, "ram_bytes", lambda: runner.HOST_RESERVE + 2**40)
    assert runner.counted_past_cap(cells, None, lambda m: None) == {}


def test_a_call_that_measures_nothing_logs_no_table_whatever_the_clock_says(tmp_path, monkeypatch):
    """What a call measured is what it saved anew, never what the clock says: a record finished in the very second a
    second call starts (a fast machine) was taken for that call's, and its sweep's table logged again (issue 62's
    run at HEAD). Here the record's clock says 'later' outright: reused as it stands, it logs no table."""
    from suite.core import launcher
    from suite.measure.step import METHODOLOGY_VERSION

    monkeypatch.setenv("SUITE_MACHINE", "m")
    prov = {"methodology": METHODOLOGY_VERSION, "commit": "c" * 40}
    monkeypatch.setattr(
        launcher,
        "run_cell",
        lambda cell, timeout=None: {
            "status": "ok",
            "metrics": {"throughput": 10.0, "memory_gb": 1.0},
            "provenance": {**prov, **cell.code},
        },
    )
    logged = []
    monkeypatch.setattr(tracking, "log_table", lambda **kw: logged.append(kw["config"]["sweep"]))
    exp = make_experiment([Row("ok", "grad_accum", labels={"precision": "FP32"})])
    req = SweepRequest(exp, profile="tiny", results_dir=tmp_path, wandb_mode="off", rounds=1)
    (first,) = sweep(req, progress=lambda m: None)
    assert logged == [first["sweep"]]
    path = store.run_path(tmp_path, first["key"], "m")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "finished": "2999-01-01T00:00:00+00:00"}))  # finished 'after' any start
    (again,) = sweep(req, progress=lambda m: None)
    assert again["sweep"] == first["sweep"] and logged == [first["sweep"]]  # reused: no second table
