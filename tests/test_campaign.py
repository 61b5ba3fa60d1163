"""The GPU campaign on CPU: the dry run exercises every stage, a stage cut at its deadline resumes, bad input fails."""

import json
import signal
import tarfile
import time
import types

import pytest
from test_runner import make_experiment

from suite.commands import cli
from suite.commands.campaign import pytest_steps, stage, stages
from suite.commands.campaign.stage import StageRequest, run_stage
from suite.commands.sweep import sweep
from suite.core import launcher, plan, runner
from suite.core.experiment import Row
from suite.core.request import SweepRequest
from suite.measure.step import METHODOLOGY_VERSION


def _dry(tmp_path, monkeypatch, numbers):
    monkeypatch.setenv("SUITE_MACHINE", "dry-machine")
    out, results = tmp_path / "out", tmp_path / "results"
    seen: list[str] = []
    reports = [run_stage(StageRequest(n, dry=True, results_dir=results, out=str(out)), seen.append) for n in numbers]
    assert all(r.done for r in reports), [(r.stage, r.left) for r in reports]
    # every sweep's cells got a record and a summary line (the benchmarks' too)
    cells = [c for r in reports for c in r.cells]
    assert all(c["status"] == "ok" or c["status"].startswith("skipped") for c in cells), cells
    names = {c["experiment"] for c in cells}
    summaries = [m for m in seen if m.startswith("stage ") and any(f" | {e}/" in m for e in names)]
    assert len(summaries) == len(cells)
    # each stage's archive carries this machine's records and reports for the machine that lent the GPU
    for n in numbers:
        with tarfile.open(out / f"campaign-dry-machine-stage-{n}.tgz") as tar:
            tarred = tar.getnames()
        assert f"results/campaign/dry-machine/stage-{n}.json" in tarred
    assert any(n.startswith("results/runs/dry-machine/") and n.endswith(".json") for n in tarred)
    return reports, names, results


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_dry_campaign_runs_its_stages_and_packs_their_results(tmp_path, monkeypatch):
    """Stages 1, 5, 6 and 7 (stages 2 to 4, the L2L tables and the benchmarks' processes, in make test-slow)."""
    reports, names, results = _dry(tmp_path, monkeypatch, [1, 5, 6, 7])
    env = json.loads((results / "campaign" / "dry-machine" / "environment.json").read_text())
    assert env["machine"]["slug"] == "dry-machine" and env["versions"]["torch"]
    first = reports[0]
    assert first.cuda_tests["collected"] >= 10 and first.cuda_tests["exit"] == 0
    counted = first.counted_vs_measured  # the count against CUDA's allocator: collected on a dry run
    assert counted["collected"] == 4 and counted["exit"] == 0, counted
    assert first.bench["exit"] == 0 and first.bench["collected"], first.bench
    assert names == {"decoder", "bench-link", "decoder-8b"}


@pytest.mark.slow
def test_dry_campaign_stages_2_to_4_run_the_l2l_tables_and_the_benchmarks(tmp_path, monkeypatch):
    reports, names, results = _dry(tmp_path, monkeypatch, [2, 3, 4])
    benchmarks = {"bench-host-optim", "bench-overhead"}
    assert names == {"table3", "table4", "table6", "table2", "table5", *benchmarks}
    assert all((results / f"{b}.md").exists() for b in benchmarks)


def _fake_cell(throughputs: dict, order: list, clock: list):
    def run_cell(cell, timeout=None):
        order.append(cell.row.name)
        clock[0] += 10.0  # each cell-round takes ten (fake) seconds
        tp = throughputs[cell.row.name].pop(0)
        metrics = {"throughput": tp, "step_time_median": 1 / tp, "step_time_min": 1 / tp, "step_time_max": 1 / tp}
        prov = {"methodology": METHODOLOGY_VERSION, "commit": "c0ffee", **cell.code}
        return {"status": "ok", "metrics": {**metrics, "timed_steps": 1}, "error": None, "provenance": prov}

    return run_cell


def test_a_sweep_cut_at_its_deadline_resumes_its_rounds_in_the_same_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    clock, order = [1000.0], []
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(
        launcher, "run_cell", _fake_cell({"a": [10.0, 12.0, 11.0], "b": [20.0, 30.0, 25.0]}, order, clock)
    )
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])
    seen = []
    first = sweep(
        SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3, deadline=1035.0),
        progress=seen.append,
    )
    # a, b, a ran (30 s); b's second round would end past the deadline, so it and the rest wait
    assert order == ["a", "b", "a"]
    assert [r["status"] for r in first] == ["partial: 2/3 rounds", "partial: 1/3 rounds"]
    assert any("deadline reached: 3 cell-round(s) left" in m for m in seen)
    again = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3), progress=seen.append)
    assert order[3:] == ["b", "a", "b"]  # only the missing rounds, still interleaved
    a, b = again
    assert a["status"] == b["status"] == "ok" and a["rounds"] == 3
    assert a["metrics"]["throughput_rounds"] == [10.0, 12.0, 11.0] and b["metrics"]["throughput"] == 25.0
    assert a["sweep"] == b["sweep"] == first[0]["sweep"]  # one sweep, continued
    assert "round_records" not in a


def test_rounds_of_another_methodology_are_not_resumed(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    clock, order = [0.0], []
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(launcher, "run_cell", _fake_cell({"a": [10.0, 12.0, 11.0, 13.0]}, order, clock))
    exp = make_experiment([Row("a", "grad_accum")])
    sweep(
        SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2, deadline=15.0),
        progress=lambda m: None,
    )
    monkeypatch.setattr(plan, "METHODOLOGY_VERSION", METHODOLOGY_VERSION + "-next")
    (rec,) = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2), progress=lambda m: None)
    assert order == ["a", "a", "a"] and rec["metrics"]["throughput_rounds"] == [12.0, 11.0]


def test_bad_stage_and_a_gpu_stage_without_a_gpu_fail_in_one_line(capsys, monkeypatch):
    assert cli.main(["campaign", "--stage", "8"]) == 2
    assert "--stage '8': give one of [1, 2, 3, 4, 5, 6, 7] or 'all'" in capsys.readouterr().err
    monkeypatch.setattr(stage, "fingerprint", lambda: {"slug": "cpu-box", "gpu": None})
    assert cli.main(["campaign", "--stage", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA device" in err and "--dry" in err


def test_partial_figures_are_shown_as_partial_and_a_smaller_ask_finishes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    clock, order = [0.0], []
    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(launcher, "run_cell", _fake_cell({"a": [10.0, 12.0, 11.0]}, order, clock))
    exp = make_experiment([Row("a", "grad_accum")])
    sweep(
        SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3, deadline=25.0),
        progress=lambda m: None,
    )
    table = (tmp_path / "runner-test.md").read_text()
    assert "| partial: 2/3 rounds |" in table and "| 11.00 |" in table and "10.00-12.00" in table
    (rec,) = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2), progress=lambda m: None)
    assert order == ["a", "a"] and rec["status"] == "ok" and rec["rounds"] == 2


def test_a_row_that_reuses_another_tables_record_runs_after_that_table():
    """Table 4's one-GPU rows take Table 3's records (Row.same_as): its sweep must come after Table 3's, in an earlier
    stage or earlier in the same one, or they would be measured anew (and the estimate, which costs them nothing,
    would be wrong)."""
    from suite.core.experiment import get_experiment

    order = [(n, i, s) for n, stage in sorted(stages.STAGES.items()) for i, s in enumerate(stage.sweeps)]
    reused = 0
    for n, i, s in order:
        for row in get_experiment(s.experiment).rows("paper"):
            if row.same_as is None or (s.only and row.name not in s.only):
                continue
            reused += 1
            twin = row.same_as[0]
            assert any(t.experiment == twin and (m, j) < (n, i) for m, j, t in order), (s.experiment, row.name, twin)
    assert reused >= 3


def test_a_stage_report_names_each_record_by_its_own_row(tmp_path, monkeypatch):
    """A stage's sweep of one row brings its table's reference row along (plan.expand): the report names every
    record by the row and key it carries, never by a list of cells zipped against the records."""
    monkeypatch.setenv("SUITE_MACHINE", "dry-machine")
    one = stages.Stage("one row of Table 3", sweeps=(stages.Sweep("table3", dry_only=("l2l-cmp-u2",)),))
    monkeypatch.setattr(stages, "STAGES", {9: one})
    made = [
        {"row": "l2l-cmp-u1", "key": "k1", "status": "ok", "metrics": {"throughput": 2.0}},
        {"row": "l2l-cmp-u2", "key": "k2", "status": "partial: 1/3 rounds", "metrics": {"throughput": 3.0}},
    ]
    monkeypatch.setattr(stage, "sweep", lambda req, progress: made)
    report = run_stage(StageRequest(9, dry=True, results_dir=tmp_path), progress=lambda m: None)
    assert [(c["row"], c["key"], c["status"]) for c in report.cells] == [
        ("l2l-cmp-u1", "k1", "ok"),
        ("l2l-cmp-u2", "k2", "partial: 1/3 rounds"),
    ]
    assert report.left == ["table3/l2l-cmp-u2"]


def test_a_part_that_cannot_fit_the_time_left_is_left_whole_for_the_next_call(tmp_path, monkeypatch):
    """A stage's part is given time by its estimate: one that needs more than remains is not started (to be cut at
    the deadline, as stage 1's microbenchmarks were on 2026-11-26), but left whole; one that fits runs."""
    from suite.commands.campaign.estimate import Line

    monkeypatch.setenv("SUITE_MACHINE", "m")
    monkeypatch.setattr(stages, "STAGES", {9: stages.Stage("parts", bench=True, counted=True)})
    lines = [Line(9, "bench", 1, 1000.0, "x"), Line(9, "counted vs measured", 1, 1.0, "x")]
    monkeypatch.setattr(stage, "estimate", lambda *a, **k: lines)
    real = stage.fingerprint
    monkeypatch.setattr(stage, "fingerprint", lambda: {**real(), "gpu": {"name": "a GPU"}})  # a stage needs one
    ran = []
    passed = {"exit": 0, "passed": 1, "failed": 0, "errors": 0, "skipped": 0}
    monkeypatch.setattr(stage, "run_pytest", lambda tests, *a: ran.append(tests) or passed)
    said = []
    report = run_stage(StageRequest(9, budget=60.0, results_dir=tmp_path), progress=said.append)
    assert report.left == ["L2L microbenchmarks"] and ran == [pytest_steps.COUNTED_TESTS]
    assert report.bench == {"exit": "not started", "seconds": 1000.0}  # the next estimate's lower bound
    line = next(m for m in said if "L2L microbenchmarks | left for the next call: it needs about 1000 s" in m)
    assert "more than the stage's whole budget: give --budget 1100 or more" in line and not report.done


def test_a_pytest_step_cut_at_the_deadline_is_left_for_the_next_call(tmp_path, monkeypatch):
    """The H200's stage 1 (2026-11-27) cut counted against measured at its deadline and listed nothing left: a cut
    part is named in `left`, as the cuda tests' is."""
    monkeypatch.setenv("SUITE_MACHINE", "m")
    monkeypatch.setattr(stages, "STAGES", {9: stages.Stage("parts", bench=True, counted=True)})
    monkeypatch.setattr(stage, "estimate", lambda *a, **k: [])
    real = stage.fingerprint
    monkeypatch.setattr(stage, "fingerprint", lambda: {**real(), "gpu": {"name": "a GPU"}})
    cut = {"exit": "timeout", "passed": None, "failed": None, "errors": None, "skipped": None}
    monkeypatch.setattr(stage, "run_pytest", lambda *a: cut)
    report = run_stage(StageRequest(9, budget=60.0, results_dir=tmp_path), progress=lambda m: None)
    assert report.left == [
        "L2L microbenchmarks (cut at the deadline)",
        "counted against measured (cut at the deadline)",
    ]
    assert not report.done


def test_a_pytest_step_cut_at_its_limit_reports_what_it_ran_and_never_an_earlier_runs_report(tmp_path, monkeypatch):
    """On the H100 (2026-11-27) stage 1's cuda tests were killed at the deadline and the stage read `18 passed` from
    the JUnit file an earlier run had left: a step now removes it first, interrupts pytest at its limit so that it
    reports the tests it finished, and where no report is written counts nothing."""
    monkeypatch.setattr(pytest_steps, "MIN_S", 1.0)
    monkeypatch.setattr(pytest_steps, "INTERRUPT_GRACE_S", 3.0)
    report = tmp_path / "steps.xml"
    stale = "<testsuites><testsuite>" + '<testcase classname="old" name="t"/>' * 18 + "</testsuite></testsuites>"
    tests = tmp_path / "test_steps.py"
    tests.write_text("import time\n\ndef test_quick():\n    pass\n\ndef test_slow():\n    time.sleep(600)\n")
    report.write_text(stale)
    # Run as a background job runs it (SIGINT ignored, and inherited): the step's pytest must still take its interrupt
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        got = pytest_steps.run_pytest((str(tests),), "not nothing", report, ["-p", "no:cacheprovider"], budget=12.0)
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert got["exit"] == "timeout" and got["seconds"] < 60, got
    assert (got["passed"], got["failed"], got["errors"]) == (1, 0, 0), got["tail"]  # test_quick, this run's report
    assert "old" not in report.read_text()
    deaf = tmp_path / "test_deaf.py"  # a run that ignores the interrupt is killed and writes nothing
    deaf.write_text("import signal, time\n\ndef test_deaf():\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "    time.sleep(600)\n")  # fmt: skip
    report.write_text(stale)
    got = pytest_steps.run_pytest((str(deaf),), "not nothing", report, ["-p", "no:cacheprovider"], budget=12.0)
    assert got["exit"] == "timeout" and got["passed"] is None and not report.exists(), got
    assert pytest_steps.counted_line(got) == "no JUnit report written (nothing counted)"


def test_the_cuda_tests_run_with_fixed_tiles_then_the_tables_shape_tuned(tmp_path, monkeypatch):
    """Stage 1's cuda tests: every one with the attention's tiles fixed, then BERT-Large's head shape tuned; one
    report of both, the tuned run not started where the first was cut at the deadline."""
    calls = []

    def fake(files, marker, report, extra, budget, env=None):
        calls.append((files, extra, env))
        return {"command": report.name, "exit": 0, "seconds": 1.0, "passed": 2, "failed": 0,
                "skipped": 1, "errors": 0, "collected": 3, "tail": report.name}  # fmt: skip

    monkeypatch.setattr(pytest_steps, "run_pytest", fake)
    got = pytest_steps.run_cuda_tests(tmp_path, [], deadline=time.time() + 100)
    (fixed_files, fixed_k, fixed_env), (tuned_files, tuned_k, tuned_env) = calls
    assert fixed_files == pytest_steps.CUDA_TESTS and fixed_env == {"SUITE_TRITON_TUNE": "0"}
    assert fixed_k == ["-k", f"not {pytest_steps.TUNED_K}"] and tuned_k == ["-k", pytest_steps.TUNED_K]
    assert tuned_files == pytest_steps.TUNED_TESTS and tuned_env is None
    assert (got["passed"], got["skipped"], got["collected"], got["exit"], got["seconds"]) == (4, 2, 6, 0, 2.0)
    calls.clear()
    monkeypatch.setattr(pytest_steps, "run_pytest", lambda *a, **k: calls.append(a) or {"exit": "timeout"})
    assert pytest_steps.run_cuda_tests(tmp_path, [], deadline=time.time() + 100) == {"exit": "timeout"}
    assert len(calls) == 1
