"""Numbers you can trust on any machine: fingerprints, records per machine, sweeps, rounds, faults, presentation."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_runner import TINY  # the one-block model the runner tests use

from suite.commands.cli import build_parser, main
from suite.commands.sweep import sweep
from suite.config.errors import ConfigError
from suite.core import launcher, registry
from suite.core.experiment import Experiment, Metric, Row
from suite.core.request import SweepRequest
from suite.core.rounds import merge
from suite.measure import machine
from suite.records import store
from suite.report.tables import as_printed, reason

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def make_experiment(rows, name="trust-test"):
    return Experiment(
        name=name,
        title="trust test",
        source="tests",
        baseline=rows[0].name,
        metrics=[Metric("throughput", "throughput", paper=False), Metric("memory_gb", "memory", unit="GB")],
        label_columns=[],
        rows=lambda profile: rows,
        base=lambda profile: TINY,
        timeout=lambda profile: 120.0,
    )


def quiet(msg):
    pass


def fake_cell(throughputs: dict, order: list):
    """A run_cell stand-in: each call pops the next throughput of its row and notes the order of calls."""

    def run_cell(cell, timeout=None):
        order.append(cell.row.name)
        tp = throughputs[cell.row.name].pop(0)
        metrics = {
            "throughput": tp,
            "step_time_median": 1 / tp,
            "step_time_min": 1 / tp,
            "step_time_max": 1 / tp,
            "timed_steps": 1,
            "memory_gb": 0.002,
        }
        return {"status": "ok", "metrics": metrics, "error": None, "provenance": {"threads": 1}}

    return run_cell


def test_the_fingerprint_names_cpu_isa_cores_ram_and_versions(monkeypatch):
    monkeypatch.delenv("SUITE_MACHINE", raising=False)
    fp = machine.fingerprint()
    cpu = fp["cpu"]
    assert cpu["model"] and cpu["logical_cores"] >= 1 and cpu["usable_cores"] >= 1
    assert set(cpu["flags"]) <= set(machine.KERNEL_FLAGS) and cpu["torch_capability"]
    assert cpu["ram_bytes"] and cpu["ram_bytes"] > 2**28
    assert fp["torch"] and fp["python"] and fp["slug"].startswith("cpu-") and fp["slug"].endswith("c")
    assert machine.describe(fp).startswith(cpu["model"])
    monkeypatch.setenv("SUITE_MACHINE", "my lab box")
    assert machine.fingerprint()["slug"] == "my-lab-box"


@pytest.mark.parametrize(
    "model, flags, cores, slug",
    [
        ("AMD EPYC 7B13 64-Core Processor", ["avx2", "fma"], 2, "cpu-epyc-7b13-avx2-2c"),
        ("AMD EPYC", ["avx2"], 2, "cpu-epyc-f25m1-avx2-2c"),
        (
            "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
            ["avx2", "avx512f", "avx512_bf16", "amx_bf16"],
            8,
            "cpu-xeon-platinum-8481c-amx-8c",
        ),
        # a "/" in the model name made the folder one level too deep: the row was never shown
        ("AMD Ryzen 7 PRO 4750U w/ Radeon Graphics", ["avx2"], 2, "cpu-ryzen-7-pro-4750u-w-radeon-graphics-avx2-2c"),
    ],
)
def test_slugs_are_short_and_tell_the_kernels(model, flags, cores, slug, monkeypatch):
    monkeypatch.delenv("SUITE_MACHINE", raising=False)
    cpu = {
        "model": model,
        "arch": "x86_64",
        "family_model_stepping": ["25", "1", "1"],
        "flags": flags,
        "usable_cores": cores,
    }
    assert machine.slug(cpu, None) == slug
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_520_809_984, "count": 1}
    assert machine.slug(cpu, gpu) == "h100-80gb"


@pytest.mark.slow  # make test-slow: about 15 s; the other trust tests run by default
def test_records_are_reused_only_on_the_machine_that_made_them(tmp_path, monkeypatch):
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])
    monkeypatch.setenv("SUITE_MACHINE", "machine-one")
    first = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=quiet)
    seen = []
    again = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=seen.append)
    assert [r["sweep"] for r in again] == [r["sweep"] for r in first]  # reused, not measured
    assert all("cached on machine-one" in m for m in seen if m.startswith("["))
    monkeypatch.setenv("SUITE_MACHINE", "machine-two")
    seen = []
    other = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=seen.append)
    assert any("measuring 2 cell(s) on machine-two" in m for m in seen)
    assert not any("cached" in m for m in seen)
    assert {r["machine"]["slug"] for r in other} == {"machine-two"}
    for slug, recs in (("machine-one", first), ("machine-two", other)):
        for r in recs:
            assert store.run_path(tmp_path, r["key"], slug).exists()
    table = (tmp_path / "trust-test.md").read_text()
    assert "tiny profile on machine-one (cpu device)" in table and "tiny profile on machine-two (cpu device)" in table
    assert table.count("Machine `machine-") == 2
    assert table.count("| a | grad_accum | ok") == 2  # one row per machine, never mixed (contended or not)


def test_a_subset_rerun_measures_its_reference_again_and_rows_of_another_sweep_keep_their_ratios(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    exp = make_experiment(
        [Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7}), Row("c", "grad_accum", {"seed": 8})]
    )
    # In the worker (one process, each shape built once): the sweeps' plans are what this test is about.
    first = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1, worker=True), quiet)
    assert _cell(tmp_path, "b", "memory ratio to a, ours").endswith("x")  # one sweep: a ratio
    second = sweep(
        SweepRequest(exp, "tiny", ["b"], force=True, results_dir=tmp_path, wandb_mode="off", rounds=1, worker=True),
        progress=quiet,
    )
    a, b = second  # the reference row `a` joins the re-run, measured beside `b` in its new sweep
    assert a["row"] == "a" and a["sweep"] == b["sweep"] != first[0]["sweep"]  # measured again, in the new sweep
    assert _cell(tmp_path, "b", "memory ratio to a, ours").endswith("x")  # so `b` carries its ratio
    said = "`c` came from earlier sweeps and take their rate ratios to the reference measured in their own"
    assert said in (tmp_path / "trust-test.md").read_text()  # the reference of c's sweep was kept (issue 44)
    assert _cell(tmp_path, "c", "memory ratio to a, ours").endswith("x")
    assert _cell(tmp_path, "b", "sweep") == b["sweep"]
    # a subset whose cells are all finished measures nothing, the reference neither
    third = sweep(SweepRequest(exp, "tiny", ["c"], results_dir=tmp_path, wandb_mode="off", rounds=1), progress=quiet)
    assert [r["finished"] for r in third] == [a["finished"], first[2]["finished"]]
    # a cell measured anew (its record lost or corrupt) takes its reference with it, finished or not
    store.run_path(tmp_path, first[2]["key"], "m").unlink()
    said = []
    a2, c2 = sweep(
        SweepRequest(exp, "tiny", ["c"], results_dir=tmp_path, wandb_mode="off", rounds=1, worker=True), said.append
    )
    assert any("trust-test/a (grad_accum, tiny): measured again" in m for m in said), said
    assert a2["sweep"] == c2["sweep"] != a["sweep"] and _cell(tmp_path, "c", "memory ratio to a, ours").endswith("x")


def _cell(results_dir, row: str, column: str) -> str:
    """The text of one cell of the markdown table trust-test.md: its table of every column (the compact one leads)."""
    lines = (results_dir / "trust-test.md").read_text().splitlines()
    cols = [
        c.strip() for c in next(x for x in lines if x.startswith("| row") and "| sweep |" in x).strip("|").split("|")
    ]
    full = lines.index(next(x for x in lines if x.startswith("| row") and "| sweep |" in x))
    cells = [c.strip() for c in next(x for x in lines[full:] if x.startswith(f"| {row} |")).strip("|").split("|")]
    return cells[cols.index(column)]


def test_rounds_interleave_the_cells_and_report_median_and_spread(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    order = []
    monkeypatch.setattr(
        launcher,
        "run_cell",
        fake_cell({"a": [10.0, 12.0, 11.0], "b": [20.0, 30.0, 25.0], "c": [10.5, 11.5, 11.0]}, order),
    )
    exp = make_experiment(
        [Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7}), Row("c", "grad_accum", {"seed": 8})]
    )
    seen = []
    recs = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3), progress=seen.append)
    assert order == ["a", "b", "c"] * 3  # ABC ABC ABC
    assert any("round 2/3" in m for m in seen)
    # each round says its own figure with its unit, the median so far, and the time left
    line = next(m for m in seen if "trust-test/a" in m and "round 2/3: partial" in m)
    assert "this round 12 samples/s (median of 2: 11)" in line and "cell-round(s) left, about" in line, line
    a, b, c = recs
    assert a["metrics"]["throughput"] == 11.0 and a["metrics"]["throughput_rounds"] == [10.0, 12.0, 11.0]
    assert b["rounds"] == 3 and b["status"] == "ok"
    assert _cell(tmp_path, "b", "within noise") == "no"  # b clearly faster
    assert _cell(tmp_path, "c", "within noise") == "yes"  # c inside a's spread
    assert _cell(tmp_path, "b", "spread") == "20.00-30.00"
    assert "median of interleaved timing rounds" in (tmp_path / "trust-test.md").read_text()


def _pathed(harnesses: dict, order: list):
    """A run_cell stand-in whose rounds record the harness path given for each of its row's calls in turn."""
    inner = fake_cell({row: [10.0 + i for i in range(len(h))] for row, h in harnesses.items()}, order)

    def run_cell(cell, timeout=None):
        out = inner(cell, timeout)
        out["provenance"] = {"threads": 1, "harness": {"dropout": harnesses[cell.row.name].pop(0)}}
        return out

    return run_cell


def test_a_cell_whose_rounds_took_different_paths_is_measured_again_under_one(tmp_path, monkeypatch):
    """No silent round choice: a round of another path sets the earlier rounds aside (kept in the record, out of
    its figures) and the cell makes them up in the same call; a path that changes twice is an error naming both."""
    monkeypatch.setenv("SUITE_MACHINE", "m")
    order, seen = [], []
    paths = {"a": [{"eager": ""}, {"triton": ""}, {"triton": ""}, {"triton": ""}], "b": [{"x": ""}] * 3}
    monkeypatch.setattr(launcher, "run_cell", _pathed(paths, order))
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])
    a, b = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3), progress=seen.append)
    assert order == ["a", "b", "a", "b", "a", "b", "a"]  # a's round of the first path made up after the third pass
    assert a["status"] == "ok" and a["rounds"] == 3 and a["metrics"]["throughput_rounds"] == [11.0, 12.0, 13.0]
    assert a["metrics"]["rounds_set_aside"] == [{"path": "dropout eager", "throughput": 10.0, "memory_gb": 0.002}]
    assert any("trust-test/a" in m and "ran another path" in m and "set aside, measured again" in m for m in seen)
    assert b["status"] == "ok" and "rounds_set_aside" not in b["metrics"]
    twice = {"a": [{"eager": ""}, {"triton": ""}, {"other": ""}]}
    monkeypatch.setattr(launcher, "run_cell", _pathed(twice, []))
    exp = make_experiment([Row("a", "grad_accum")])
    (a,) = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path / "2", wandb_mode="off", rounds=3), progress=quiet)
    assert a["status"].startswith("error: its rounds took different paths twice") and "other" in a["status"]


def test_rounds_set_aside_stay_in_evidence_when_the_cell_resumes_in_a_later_call(tmp_path, monkeypatch):
    """A cell cut at its deadline after a change of path keeps the rounds it set aside in its partial record, and
    the call that resumes it keeps them in the final one."""
    import types

    from suite.core import runner
    from suite.measure.step import METHODOLOGY_VERSION

    monkeypatch.setenv("SUITE_MACHINE", "m")
    clock, order = [1000.0], []
    inner = _pathed({"a": [{"eager": ""}] + [{"triton": ""}] * 3}, order)

    def timed(cell, timeout=None):
        clock[0] += 10.0
        out = inner(cell, timeout)
        out["provenance"].update(methodology=METHODOLOGY_VERSION, **cell.code)  # what a resume requires
        return out

    monkeypatch.setattr(runner, "time", types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(launcher, "run_cell", timed)
    exp = make_experiment([Row("a", "grad_accum")])
    req = SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3, deadline=1025.0)
    (cut,) = sweep(req, progress=quiet)  # eager, then triton (the eager round set aside), then the deadline
    assert cut["status"] == "partial: 1/3 rounds" and cut["metrics"]["rounds_set_aside"][0]["path"].endswith("eager")
    (done,) = sweep(dataclasses.replace(req, deadline=None), progress=quiet)
    assert done["status"] == "ok" and done["rounds"] == 3 and len(order) == 4
    assert [r["path"].split("; ")[-1] for r in done["metrics"]["rounds_set_aside"]] == ["dropout eager"]


def test_rounds_more_than_twice_apart_are_marked_whatever_the_cause(tmp_path, monkeypatch):
    """Rounds 2x apart, with no contention watched in any of them: the row is marked and shows no ratio."""
    monkeypatch.setenv("SUITE_MACHINE", "m")
    monkeypatch.setattr(launcher, "run_cell", fake_cell({"a": [10.0, 10.5, 9.8], "b": [10.0, 31.0, 30.0]}, []))
    exp = make_experiment([Row("a", "grad_accum"), Row("b", "grad_accum", {"seed": 7})])
    a, b = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=3), progress=quiet)
    assert "contention" not in a["metrics"]
    assert b["metrics"]["contention"]["contended"] and "3.1x apart" in b["metrics"]["contention"]["reasons"][0]
    assert _cell(tmp_path, "b", "status") == "ok, contended"
    assert _cell(tmp_path, "b", "throughput ratio to a, ours") == "—"


def test_kinds_that_time_a_rate_are_measured_in_rounds():
    from suite.core.kinds import is_timed

    assert is_timed("throughput") and is_timed("all-ranks-throughput") and not is_timed("finetune")


def test_a_failed_round_keeps_the_rounds_measured_before_it():
    ok = {
        "status": "ok",
        "metrics": {
            "throughput": 5.0,
            "step_time_median": 0.2,
            "step_time_min": 0.2,
            "step_time_max": 0.2,
            "timed_steps": 1,
        },
    }
    assert merge([ok], 3)["status"] == "partial: 1/3 rounds"
    failed = merge([ok, {"status": "timeout", "metrics": {}, "error": None}], 3)
    assert failed["status"] == "timeout" and failed["metrics"]["throughput_rounds"] == [5.0]
    assert merge([ok, ok, ok], 3)["status"] == "ok"


@pytest.mark.slow  # make test-slow (about 10 s)
def test_a_corrupt_record_gets_one_warning_and_its_cell_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "m")
    exp = make_experiment([Row("a", "grad_accum")])
    (rec,) = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=quiet)
    path = store.run_path(tmp_path, rec["key"], "m")
    path.write_text(path.read_text()[:40])  # truncated mid-write
    seen = []
    (again,) = sweep(SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1), progress=seen.append)
    warnings = [m for m in seen if m.startswith("warning:")]
    assert warnings and str(path) in warnings[0] and "\n" not in warnings[0]
    assert again["status"] == "ok" and again["sweep"] != rec["sweep"]
    assert json.loads(path.read_text())["status"] == "ok"


@pytest.mark.parametrize(  # a fresh cell process, or the long-lived worker; the other pairs in make test-slow
    "sig,worker",
    [
        (signal.SIGKILL, True),
        pytest.param(signal.SIGTERM, False, marks=pytest.mark.slow),
        pytest.param(signal.SIGKILL, False, marks=pytest.mark.slow),
        pytest.param(signal.SIGTERM, True, marks=pytest.mark.slow),
    ],
)
def test_killing_the_runner_ends_its_cell_and_writes_no_record(tmp_path, sig, worker):
    pidfile = tmp_path / "cell.pid"
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {TESTS!r}]
        import plugin_methods
        from suite.core.experiment import Experiment, Metric, Row
        from suite.core.request import SweepRequest
        from suite.core.runner import run_cells
        exp = Experiment(name="kill-test", title="t", source="t", baseline="s", label_columns=[],
                         metrics=[Metric("throughput", "throughput")], rows=lambda p: [Row("s", "sleeps")],
                         base=lambda p: {TINY!r})
        run_cells(SweepRequest(exp, "tiny", results_dir={str(tmp_path)!r}, wandb_mode="off", rounds=1, worker={worker}))
    """)
    env = {
        **os.environ,
        "SUITE_PLUGINS": "plugin_methods",
        "SUITE_TEST_PIDFILE": str(pidfile),
        "PYTHONPATH": os.pathsep.join([ROOT, TESTS]),
        "SUITE_MACHINE": "m",
    }
    runner_proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT)
    deadline = time.time() + 90
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline and runner_proc.poll() is None, "the cell never started"
        time.sleep(0.2)
    cell_pid = int(pidfile.read_text())
    with open(f"/proc/{cell_pid}/cmdline") as f:
        assert ("suite.core.worker" in f.read()) == worker  # the step ran where it was meant to
    runner_proc.send_signal(sig)
    runner_proc.wait(timeout=30)
    deadline = time.time() + 15
    while _alive(cell_pid):
        assert time.time() < deadline, f"cell {cell_pid} outlived its runner killed with {sig.name}"
        time.sleep(0.2)
    assert not list((tmp_path / "runs").glob("**/*.json"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "row, words",
    [
        (
            Row("pipe", "gpipe", {"executor": "dist", "stages": 2, "width": 3, "num_micro_batches": 4}),
            ["trust-test/pipe", "width=3 must divide num_micro_batches=4", "choose width in [1, 2, 4]"],
        ),
        (
            Row("l2l", "l2l", {"ranks": 2, "micro_batch_size": 3}),
            ["trust-test/l2l", "micro_batch_size=3 must be a multiple of ranks", "micro_batch_size=4"],
        ),
        (Row("deep", "pipedream-flush", {"executor": "dist", "stages": 9}), ["stages=9", "choose 1..3"]),
    ],
)
def test_multi_rank_constraints_fail_before_any_process_is_launched(row, words, tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "run_cell", lambda *a, **k: pytest.fail("a process was launched"))
    with pytest.raises(ConfigError) as err:
        sweep(SweepRequest(make_experiment([row]), "tiny", results_dir=tmp_path, wandb_mode="off"), progress=quiet)
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg
    assert not (tmp_path / "runs").exists()


def test_check_refuses_a_bad_multi_rank_config_in_one_line(capsys):
    assert main(["check", "gpipe", "--set", "executor=dist", "--set", "width=3", "--set", "num_micro_batches=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "choose width in" in err


def test_check_defaults_to_the_methods_declared_reference(capsys):
    assert registry.get("pipedream-2bw").reference == "2bw-reference"
    assert main(["check", "pipedream-2bw", "--set", "model.layers=2", "--set", "seq_len=8"]) == 0
    assert "against 2bw-reference" in capsys.readouterr().out


def test_every_cli_option_has_help_text():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"`suite {name}` option {action.option_strings or action.dest} has no help"


def test_presentation_units_paper_values_and_reasons():
    assert as_printed(10.51) == "10.51" and as_printed(89.0) == "89.0" and as_printed("NA") == "NA"
    tb = "Traceback (most recent call last):\n  File x\ntorch.OutOfMemoryError: CPU live-bytes tracker: 9 bytes\n"
    assert reason({"status": "oom", "error": tb}) == "torch.OutOfMemoryError: CPU live-bytes tracker: 9 bytes"
    assert reason({"status": "timeout", "error": "====\nrank 0 waiting\n"}) == "timeout"
    why = "not counted: DeepSpeed's engine builds flat buffers"
    assert reason({"status": "not_implemented", "error": why}) == why  # recorded without running: its one line
