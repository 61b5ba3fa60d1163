"""The sweep's steps read and tested alone: the request, the plan (nothing runs) and the recorder (nothing runs)."""

import dataclasses

import pytest
from test_runner import make_experiment

from suite.config.errors import ConfigError
from suite.core.cell_code import code_of
from suite.core.experiment import Row
from suite.core.plan import COMPLETE, LEFT, NOT_RUN, PAST_CAP, RESUME, REUSED, RUN, STALE, TWIN, expand, plan
from suite.core.recorder import Recorder
from suite.core.request import SweepRequest
from suite.records.index import Index


@pytest.fixture
def rows():
    return [
        Row("done", "grad_accum"),
        Row("future", "not-a-method-yet"),
        Row("half", "grad_accum", {"seed": 7}),
        Row("whole", "grad_accum", {"seed": 8}),
        Row("new", "grad_accum", {"seed": 9}),
    ]


def _code(kind="throughput", method="grad_accum"):
    """The code a cell of `kind` and `method` runs now (suite.core.cell_code): a record of it is current."""
    return code_of(kind, method)["code"]


def _outcome(status="ok", throughput=10.0, methodology="1", cell=None):
    """A cell's outcome by the code it runs now (a `grad_accum` cell's where no cell is given)."""
    code = cell.code if cell is not None else {"code": _code()}
    return {
        "status": status,
        "metrics": {"throughput": throughput},
        "error": None,
        "provenance": {"methodology": methodology, **code},
    }


class OneRoundThenInterrupted:
    """A launcher for the runner: the first cell-round measures, the next is interrupted (as Ctrl-C in a cell)."""

    def __init__(self):
        self.log: list[str] = []

    def run(self, cell, timeout):
        from suite.records.schema import failed

        self.log.append(cell.key)
        return _outcome(throughput=20.0) if len(self.log) == 1 else failed("error: interrupted")

    def close(self, completed):
        pass


def test_a_request_is_checked_and_resolved_when_made(tmp_path, rows):
    exp = make_experiment(rows)
    req = SweepRequest(exp, "tiny", only=["d*"], overrides=["steps=2"], results_dir=tmp_path, wandb_mode="off")
    assert (req.rounds, req.only, req.overrides, req.variant) == (exp.rounds, ("d*",), ("steps=2",), "set steps=2")
    with pytest.raises(ConfigError, match="--rounds 0"):
        SweepRequest(exp, "tiny", rounds=0)
    with pytest.raises(ConfigError, match="--measure 'weigh'"):
        SweepRequest(exp, "tiny", measure="weigh")
    with pytest.raises(ConfigError, match="unknown profile"):
        SweepRequest(exp, "huge")


def test_the_plan_decides_each_cell_before_anything_runs(tmp_path, rows, monkeypatch):
    """Reused (finished here), not run (no such method: why), resumed to completion, resumed in part, new."""
    from suite.measure.step import METHODOLOGY_VERSION

    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2)
    cells = {c.row.name: c for c in expand(req)}
    fp = {"slug": "m"}
    rec = Recorder(req, fp, "old-sweep", progress=lambda m: None)
    rec.save(cells["done"], _outcome())
    one_round = [dict(_outcome(methodology=METHODOLOGY_VERSION))]
    rec.save(cells["half"], {**_outcome(), "status": "partial: 1/2 rounds", "round_records": one_round})
    rec.save(cells["whole"], {**_outcome(), "status": "partial: 1/2 rounds", "round_records": one_round * 2})
    seen = []
    p = plan(req, list(cells.values()), "m", seen.append)
    assert [(d.cell.row.name, d.action, d.rounds) for d in p.decisions] == [
        ("done", REUSED, 0),
        ("future", NOT_RUN, 0),
        ("half", RESUME, 1),
        ("whole", COMPLETE, 0),
        ("new", RUN, 2),
    ]
    assert any("done (grad_accum, tiny): ok (cached on m" in s for s in seen)
    assert p.of(NOT_RUN)[0].why == "method 'not-a-method-yet' is not registered yet"
    assert [c.row.name for c in p.todo] == ["half", "new"] and len(p.of(RESUME)[0].resumed) == 1
    assert p.sweep == "old-sweep"  # the rounds go on in their sweep
    # progress numbers what runs, among what runs: [1/2] and [2/2], not [3/5] and [5/5]
    assert [p.tags[c.key].split(" ")[0] for c in p.todo] == ["[1/2]", "[2/2]"]
    assert p.tags[cells["done"].key].startswith("runner-test/done (grad_accum")
    assert [[c.row.name for c in cells] for cells in p.passes()] == [["new"], ["half", "new"]]  # half waits a pass
    forced = plan(
        SweepRequest(req.experiment, "tiny", results_dir=tmp_path, force=True), list(cells.values()), "m", print
    )
    assert {d.action for d in forced.decisions} == {NOT_RUN, RUN} and forced.sweep != "old-sweep"


def test_a_finished_timed_record_of_another_code_is_stale_and_measured_again(tmp_path, rows):
    """A record's code is part of its currency (issue 51): a finished timed record another code measured (or one
    that recorded no code) is `stale`, measured again in every round unless the sweep keeps it; `only` measures
    the stale ones and leaves every other cell as it stands. Counts keep their own rule."""
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2)
    cells = {c.row.name: c for c in expand(req)}
    rec = Recorder(req, {"slug": "m"}, "old-sweep", progress=lambda m: None)
    old = {**_outcome(), "provenance": {"methodology": "1", "code": "0123456789abcdef", "commit": "a05344b" * 6}}
    rec.save(cells["done"], old)
    rec.save(cells["half"], {**_outcome(), "provenance": {"methodology": "1"}})  # before codes were recorded
    rec.save(cells["whole"], _outcome())  # this code's
    seen = []
    p = plan(req, list(cells.values()), "m", seen.append)
    got = {d.cell.row.name: (d.action, d.rounds) for d in p.decisions}
    assert got == {
        "done": (STALE, 2),
        "future": (NOT_RUN, 0),
        "half": (STALE, 2),
        "whole": (REUSED, 0),
        "new": (RUN, 2),
    }
    said = next(s for s in seen if "done (grad_accum, tiny): stale" in s)
    assert "measured by code 0123456789abcdef at a05344b; this code is" in said and "--keep-stale" in said
    assert "(unrecorded)" in p.of(STALE)[1].why
    assert [c.row.name for c in p.todo] == ["done", "half", "new"]
    assert p.sweep != "old-sweep"  # measured anew, in a sweep of its own
    kept = plan(dataclasses.replace(req, stale="keep"), list(cells.values()), "m", seen.append)
    # kept, save the reference row ("done"), measured again beside the row that runs in a new sweep
    assert [d.cell.row.name for d in kept.of(REUSED)] == ["half", "whole"] and kept.of(RUN)[0].cell.row.name == "done"
    assert any("done (grad_accum, tiny): ok (cached on m" in s and "stale: measured by code" in s for s in seen)
    only = plan(dataclasses.replace(req, stale="only"), list(cells.values()), "m", seen.append)
    assert [d.action for d in only.decisions] == [STALE, LEFT, STALE, REUSED, LEFT]
    assert only.of(LEFT)[1].outcome is None and [c.row.name for c in only.todo] == ["done", "half"]
    with pytest.raises(ConfigError, match="stale='some'"):
        SweepRequest(req.experiment, "tiny", stale="some")
    # A stale record that cannot be measured again here (its library missing) is kept, never replaced by an error
    absent = plan(req, list(cells.values()), "m", seen.append, unavailable=lambda c: "its library is not installed")
    assert absent.decisions[0].action == REUSED and "cannot be measured again here" in absent.decisions[0].why
    # A count past the cap never replaces a stale record, which ran under its cap: only cells never measured
    precounting = dataclasses.replace(req, precount=True)
    everything_past = lambda todo: {c.key: {"status": "oom", "error": "counted past its cap"} for c in todo}  # noqa: E731
    capped = plan(precounting, list(cells.values()), "m", seen.append, past_cap=everything_past)
    assert [d.action for d in capped.decisions] == [STALE, NOT_RUN, STALE, REUSED, PAST_CAP]


def test_only_stale_measures_the_reference_beside_the_stale_rows(tmp_path, rows):
    """--only-stale leaves cells that are not stale, but a ratio needs its reference in the same sweep: a reference
    of this code is measured again beside the stale rows (as a subset re-run's is)."""
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", stale="only")
    cells = {c.row.name: c for c in expand(req)}
    rec = Recorder(req, {"slug": "m"}, "old-sweep", progress=lambda m: None)
    rec.save(cells["done"], _outcome())  # the reference, this code's
    rec.save(cells["half"], {**_outcome(), "provenance": {"methodology": "1", "code": "0123456789abcdef"}})
    p = plan(req, list(cells.values()), "m", lambda m: None)
    got = {d.cell.row.name: d.action for d in p.decisions}
    assert got == {"done": RUN, "future": LEFT, "half": STALE, "whole": LEFT, "new": LEFT}


def test_a_stale_record_measured_again_is_kept_aside_and_a_cut_one_resumes(tmp_path, rows, monkeypatch):
    """The runner measures a stale record again; the old one is kept with the store's earlier records (no result
    lost), and a call interrupted after one round leaves a partial record of this code, which the next resumes."""
    from suite.core import runner

    monkeypatch.setenv("SUITE_MACHINE", "m")
    req = SweepRequest(make_experiment(rows[:1]), "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2)
    (cell,) = expand(req)
    old = {**_outcome(), "provenance": {"methodology": "1", "code": "0123456789abcdef"}}
    Recorder(req, {"slug": "m"}, "old-sweep", progress=lambda m: None).save(cell, old)

    monkeypatch.setattr(runner, "choose", lambda *a: OneRoundThenInterrupted())
    with pytest.raises(runner.Interrupted):
        runner.run_cells(req, progress=lambda m: None)
    now = Index(tmp_path).cell(cell.key, "m")
    assert now["status"] == "partial: 1/2 rounds" and now["provenance"]["code"] == _code()
    assert Index(tmp_path).kept(cell.key, "m", "old-sweep")[0]["provenance"]["code"] == "0123456789abcdef"
    again = plan(req, [cell], "m", lambda m: None)
    assert [(d.action, d.rounds) for d in again.decisions] == [(RESUME, 1)]


def test_an_interrupted_forced_cell_keeps_its_earlier_record_and_names_the_command_that_goes_on(
    tmp_path, rows, monkeypatch
):
    """Under --force a cell's earlier record stands until its replacement is complete: a call interrupted after one
    round of two leaves it as it was, and says the command that measures it again (the whole path, Ctrl-C in a
    real sweep: tests/test_faults.py, in make test-slow)."""
    from suite.core import runner

    monkeypatch.setenv("SUITE_MACHINE", "m")
    req = SweepRequest(make_experiment(rows[:1]), "tiny", results_dir=tmp_path, wandb_mode="off", rounds=2, force=True)
    (cell,) = expand(req)
    Recorder(req, {"slug": "m"}, "old-sweep", progress=lambda m: None).save(cell, _outcome(throughput=7.0))
    before = Index(tmp_path).cell(cell.key, "m")

    monkeypatch.setattr(runner, "choose", lambda *a: OneRoundThenInterrupted())
    with pytest.raises(runner.Interrupted) as cut:
        runner.run_cells(req, progress=lambda m: None)
    assert Index(tmp_path).cell(cell.key, "m") == before
    assert "0 cell(s) measured again in full, 1 not" in str(cut.value)
    assert str(cut.value).endswith("--force --rounds 2 --only done")


def test_the_recorder_saves_a_record_as_it_stands(tmp_path, rows):
    """The recorder saves; W&B is written at the sweep's end from the saved records (tests/test_faults.py)."""
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="offline")
    (cell,) = expand(SweepRequest(req.experiment, "tiny", only=["done"], results_dir=tmp_path))
    record = Recorder(req, {"slug": "m"}, "s1", print).save(cell, _outcome(), tag="[1/1] done")
    saved = Index(tmp_path).cell(cell.key, "m")
    assert saved == {**record, "schema": saved["schema"]} and "wandb_dir" not in saved
    assert (saved["sweep"], saved["row"], saved["machine"], saved["variant"]) == ("s1", "done", {"slug": "m"}, "")


def test_a_resume_continues_only_rounds_of_the_same_code_and_harness():
    """Rounds of other code (the cell's code, suite.core.cell_code) are measured anew; rounds of another harness
    (dropout path, host LAMB kernel) are not merged with the latest one's."""
    from suite.core.rounds import merge, resumable
    from suite.measure.step import METHODOLOGY_VERSION as M

    def rnd(tp, code=None, harness=None):
        prov = {"methodology": M, "code": code or _code(), "harness": harness or {"dropout": {"per_sample": ""}}}
        return {"status": "ok", "metrics": {"throughput": tp}, "provenance": prov}

    partial = {"status": "partial: 2/3 rounds", "round_records": [rnd(10.0), rnd(12.0)]}
    assert len(resumable(partial, M, _code())) == 2
    assert resumable(partial, M, "another-tree") == []
    older = {"status": "partial: 1/3 rounds", "round_records": [{**rnd(10.0), "provenance": {"methodology": M}}]}
    assert resumable(older, M, _code()) == []  # made before the digest: measured anew
    fallback = {"dropout": {"per_sample": ""}, "host_lamb": "foreach (fallback: no compiler)"}
    merged = merge([rnd(10.0), rnd(12.0), rnd(30.0, harness=fallback)], planned=3)
    assert merged["status"] == "partial: 1/3 rounds, 2 set aside (another code or harness path)"
    assert merged["metrics"]["throughput"] == 30.0 and merged["metrics"]["throughput_rounds"] == [30.0]
    assert merge([rnd(10.0), rnd(12.0), rnd(11.0)], planned=3)["metrics"]["throughput"] == 11.0


def test_a_row_the_same_as_another_tables_cell_reuses_its_record(tmp_path, monkeypatch):
    """Table 4's one-rank rows are Table 3's L2L-CMP cells: a finished Table 3 record here is reused (its sweep
    kept, so no ratio is taken across sweeps); a missing one makes the row wait for it, never run as itself."""
    from suite.core.experiment import get_experiment
    from suite.core.recorder import Recorder

    t3 = SweepRequest(get_experiment("table3"), "tiny", only=["l2l-cmp-u1"], results_dir=tmp_path, wandb_mode="off")
    (c3,) = expand(t3)
    done = {**_outcome(cell=c3), "metrics": {"throughput": 5.0}}
    Recorder(t3, {"slug": "m"}, "sweep-of-table3", print).save(c3, done)
    t4 = SweepRequest(get_experiment("table4"), "tiny", only=["1-rank-u*"], results_dir=tmp_path, wandb_mode="off")
    cells = expand(t4)
    seen = []
    p = plan(t4, cells, "m", seen.append)
    assert [(d.cell.key, d.action) for d in p.decisions] == [(c.key, TWIN) for c in cells] and p.todo == []
    twin = p.decisions[0].outcome
    for d in p.decisions[1:]:  # no Table 3 record of theirs here: they wait for it
        want = f"pending: the same cell as table3/l2l-cmp-u{d.cell.row.name[-1]}"
        assert d.outcome["status"].startswith(want)
    assert twin["metrics"] == {"throughput": 5.0, "throughput_per_rank": 5.0}
    assert twin["reused_from"] == {
        "experiment": "table3",
        "row": "l2l-cmp-u1",
        "key": c3.key,
        "sweep": "sweep-of-table3",
    }
    saved = Recorder(t4, {"slug": "m"}, "sweep-of-table4", print).save(cells[0], twin)
    assert saved["sweep"] == "sweep-of-table3" and any("the same cell as table3/l2l-cmp-u1" in s for s in seen)


def test_a_row_the_same_as_another_tables_cell_is_measured_once_as_that_cell(tmp_path, monkeypatch):
    """Table 4 alone, no Table 3 record: Table 3's sweep measures its cell first (its record, its table), Table 4
    reads it; run again, nothing is measured; forced, the twin is measured anew once and read again."""
    from suite.commands.sweep import sweep
    from suite.core import launcher
    from suite.core.experiment import get_experiment

    monkeypatch.setenv("SUITE_MACHINE", "m")
    ran = []

    def run_cell(cell, timeout=None):
        ran.append(f"{cell.experiment}/{cell.row.name}")
        return {**_outcome(cell=cell), "metrics": {"throughput": 5.0, "memory_gb": 0.1}}

    monkeypatch.setattr(launcher, "run_cell", run_cell)
    t4 = SweepRequest(get_experiment("table4"), "tiny", only=["1-rank-u1"], results_dir=tmp_path, wandb_mode="off")
    seen = []
    (rec,) = [r for r in sweep(t4, seen.append) if r["row"] == "1-rank-u1"]
    assert ran == ["table3/l2l-cmp-u1"] * 3  # its three rounds, as Table 3's cell, and nothing as Table 4's
    assert rec["status"] == "ok" and rec["reused_from"]["experiment"] == "table3"
    assert rec["metrics"]["throughput_per_rank"] == 5.0 and (tmp_path / "table3.md").exists()
    sweep(t4, seen.append)
    assert len(ran) == 3
    sweep(dataclasses.replace(t4, force=True), seen.append)
    assert ran == ["table3/l2l-cmp-u1"] * 6


def test_a_twin_that_finished_badly_gives_the_row_its_status_and_across_nodes_a_row_is_its_own(tmp_path):
    """A Table 3 cell that ran out of memory is Table 4's row's verdict too (not a row pending for ever); a sweep
    across nodes makes records of its own, so there the row runs as itself."""
    from suite.config.launch import Nodes
    from suite.core.experiment import get_experiment
    from suite.core.plan import same_as
    from suite.core.recorder import Recorder

    t3 = SweepRequest(get_experiment("table3"), "tiny", only=["l2l-cmp-u1"], results_dir=tmp_path, wandb_mode="off")
    (c3,) = expand(t3)
    Recorder(t3, {"slug": "m"}, "s3", print).save(c3, {**_outcome("oom", cell=c3), "error": "out of memory"})
    t4 = SweepRequest(get_experiment("table4"), "tiny", only=["1-rank-u1"], results_dir=tmp_path, wandb_mode="off")
    (c4,) = expand(t4)
    got = same_as(t4, c4, "m")
    assert got["status"] == "oom" and got["error"] == "out of memory" and got["reused_from"]["key"] == c3.key
    across = dataclasses.replace(t4, nodes=Nodes(2, 0, "127.0.0.1:29500"))
    assert same_as(across, c4, "m") is None


def _a_count(tmp_path, rows):
    """A count request for the row `done`, its cell, and an `ok` count of it by this code, torch and transformers."""
    from suite.measure.provenance import versions

    req = SweepRequest(
        make_experiment(rows), "tiny", only=["done"], results_dir=tmp_path, wandb_mode="off", measure="count"
    )
    (cell,) = expand(req)
    torch_v, transformers_v = versions()
    prov = {"methodology": "1", "code": cell.code["code"], "torch": torch_v, "transformers": transformers_v}
    return req, cell, {"status": "ok", "metrics": {"memory_gb": 1.5}, "error": None, "provenance": prov}


def test_a_count_made_on_another_cpu_by_the_same_code_and_versions_is_reused(tmp_path, rows):
    """Counts run on fake tensors: a new machine takes another's count of the same cell where the code and torch's
    and transformers' versions are the same (no re-count on every CPU fingerprint), and counts again where not."""
    req, cell, counted = _a_count(tmp_path, rows)
    prov = counted["provenance"]
    Recorder(req, {"slug": "cpu-a"}, "s", print).save(cell, counted)
    seen = []
    (d,) = plan(req, [cell], "cpu-b", seen.append).decisions
    assert d.action == REUSED and d.outcome["metrics"]["memory_gb"] == 1.5 and "counted on cpu-a" in d.why
    assert any("reused, not counted again" in s for s in seen)
    Recorder(req, {"slug": "cpu-a"}, "s", print).save(cell, {**counted, "provenance": {**prov, "torch": "2.0.0"}})
    assert plan(req, [cell], "cpu-b", print).decisions[0].action == RUN  # another torch: counted again
    timed = SweepRequest(req.experiment, "tiny", only=["done"], results_dir=tmp_path, wandb_mode="off")
    (t,) = expand(timed)
    Recorder(timed, {"slug": "cpu-a"}, "s", print).save(t, {**counted, "provenance": prov})
    assert plan(timed, [t], "cpu-b", print).decisions[0].action == RUN  # a timing is its machine's alone


def test_a_count_of_this_machine_made_under_another_transformers_is_counted_again(tmp_path, rows):
    """A count made under transformers 5.23.0 was reused under 5.24.0, where docs/experiments.md says a count is
    reused only from the same torch and transformers."""
    req, cell, counted = _a_count(tmp_path, rows)
    prov = counted["provenance"]
    Recorder(req, {"slug": "m"}, "s", print).save(cell, counted)
    assert plan(req, [cell], "m", print).decisions[0].action == REUSED
    Recorder(req, {"slug": "m"}, "s", print).save(cell, {**counted, "provenance": {**prov, "transformers": "0.1"}})
    seen = []
    (d,) = plan(req, [cell], "m", seen.append).decisions
    assert (
        d.action == STALE
        and f"transformers 0.1; this is torch {prov['torch']}, transformers {prov['transformers']}" in d.why
    )
    assert any("stale" in s and "measured again" in s for s in seen), seen


def test_contended_measures_again_only_the_busy_rows_and_their_reference(tmp_path):
    """Re-running a contended table returned cached rows without ratios and a nine-`--only` `--force` command to
    paste; `--contended` measures the busy rows again with their reference, and leaves the rest."""
    exp = make_experiment([Row("ref", "grad_accum"), Row("busy", "grad_accum", {"seed": 7}),
                           Row("calm", "grad_accum", {"seed": 8})])  # fmt: skip
    req = SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off")
    busy = {"contended": True, "reasons": ["another process"]}
    for cell in expand(req):
        out = _outcome()
        if cell.row.name == "busy":
            out["metrics"] = {**out["metrics"], "contention": busy}
        Recorder(req, {"slug": "m"}, "s1", print).save(cell, out)
    again = dataclasses.replace(req, contended=True)
    seen = []
    decisions = {d.cell.row.name: d.action for d in plan(again, expand(again), "m", seen.append).decisions}
    assert decisions == {"ref": RUN, "busy": STALE, "calm": LEFT}, decisions
    assert any("busy" in s and "contended" in s and "measured again" in s for s in seen), seen
    with pytest.raises(ConfigError, match="drop --force"):
        SweepRequest(exp, "tiny", contended=True, force=True)
    from suite.report.tables import contended_command

    assert contended_command("t", "tiny", ["--set", "steps=2"]).endswith(
        "run t --profile tiny --set steps=2 --contended"
    )
