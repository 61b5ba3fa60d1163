"""The record schema: every committed record matches it; the store stamps its version and refuses a mismatch."""

import json
from pathlib import Path

import pytest

from suite.config import paths
from suite.records import store
from suite.records.index import Index
from suite.records.schema import SCHEMA_VERSION, Outcome, Record, problems

GOOD = {
    "status": "ok",
    "metrics": {"throughput": 10.0},
    "error": None,
    "provenance": {"methodology": "m"},
    "key": "k",
    "experiment": "e",
    "row": "r",
    "method": "grad_accum",
    "profile": "tiny",
    "device_type": "cpu",
    "variant": "",
    "config": {"run": {"method": "grad_accum"}},
    "finished": "2026-11-25T00:00:00+00:00",
    "sweep": "s",
    "duration_s": 3,  # a whole number of seconds is a float too
}


def test_every_committed_record_matches_the_schema():
    found = list((Path(paths.ROOT) / "results").glob("runs/**/*.json"))
    assert found, "no committed records found"
    bad = {str(p): problems(json.loads(p.read_text())) for p in found}
    assert not {p: w for p, w in bad.items() if w}


@pytest.mark.parametrize(
    "change, words",
    [
        ({"metrics": None}, "'metrics' is a NoneType"),
        ({"status": 3}, "'status' is a int"),
        ({"sweep": ["s"]}, "'sweep' is a list"),
        ({"schema": 0}, "schema 0 is not one this suite reads"),
        ({"metrics": {"throughput": "abc"}}, "metric 'throughput' is a str"),
        # every reader reads a row back from config.run: without it a table crashed after a whole sweep
        ({"config": {"kind": "throughput"}}, "config has no run object"),
    ],
)
def test_a_record_that_does_not_match_gets_one_warning_naming_its_file(tmp_path, change, words):
    assert problems(GOOD) == []
    path = store.run_path(tmp_path, "k", "m")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**GOOD, **change}))
    seen = []
    assert Index(tmp_path).cell("k", "m", warn=seen.append) is None
    (line,) = seen
    assert str(path) in line and words in line and "record schema" in line and "\n" not in line


def test_a_missing_key_is_named_and_optional_ones_may_be_absent():
    assert problems({k: v for k, v in GOOD.items() if k != "row"}) == ["no 'row'"]
    assert problems({"status": "timeout", "metrics": {}, "provenance": None}, Outcome) == []
    assert "sweep" in Record.__optional_keys__ and "metrics" in Record.__required_keys__


def test_saved_records_carry_the_schema_version(tmp_path):
    store.save(tmp_path, "k", "m", {**GOOD, "machine": {"slug": "m"}})
    assert Index(tmp_path).cell("k", "m")["schema"] == SCHEMA_VERSION


def test_an_outcome_off_the_schema_becomes_an_error_status(monkeypatch):
    """What a cell's process writes is checked where it comes back: a kind returning no metrics dict is the cell's
    error, not a record the store would later refuse."""
    import sys

    from suite.core import process

    def bad_cell(world, cfg_path, out_path, nodes, rdzv_id):
        outcome = {"status": "ok", "metrics": None, "provenance": None}
        return [sys.executable, "-c", f"import json; json.dump({outcome!r}, open({out_path!r}, 'w'))"]

    monkeypatch.setattr(process, "_command", bad_cell)
    record, failure = process.launch({"row": "r"}, 1, 60.0)
    assert record is None and failure["status"].startswith("error: the cell's outcome does not match")
    assert "'metrics' is a NoneType" in failure["status"]


def test_a_status_is_read_once_into_its_kind_and_detail():
    """The one reader of status strings (suite.records.schema.status_of): the other modules ask its kind."""
    from suite.records.schema import Status, status_of

    assert status_of({"status": "partial: 1/3 rounds"}) == Status("partial", "1/3 rounds")
    assert status_of("error: ValueError: bad: worse") == Status("error", "ValueError: bad: worse")
    assert status_of("not_implemented") == Status("not_implemented") and status_of(None) == Status("")
    assert [status_of(s).finished for s in ("ok", "oom", "partial: 1/2 rounds", "timeout")] == [1, 1, 0, 0]
    assert [status_of(s).measured for s in ("ok", "oom", "partial: 1/2 rounds")] == [1, 0, 1]
    assert [status_of(s).unfinished for s in ("pending: left", "partial: 1/2 rounds", "error: x")] == [1, 1, 0]


def test_a_record_without_a_run_config_is_set_aside_and_its_table_renders(tmp_path):
    from suite.core.experiment import get_experiment
    from suite.report import tables

    exp = get_experiment("table2")
    rec = {**GOOD, "experiment": "table2", "row": "baseline-fp32", "config": {"kind": "throughput"}}
    store.run_path(tmp_path, "k", "m").parent.mkdir(parents=True)
    store.run_path(tmp_path, "k", "m").write_text(json.dumps(rec))
    md, _ = tables.write_tables(exp, tmp_path)  # was: KeyError: 'run', after a sweep had measured everything
    assert "No records yet" in md.read_text()


def test_an_empty_results_setting_is_refused_and_a_relative_one_is_the_callers(tmp_path):
    """An empty SUITE_RESULTS_DIR meant the working folder: `render` wrote 50 tables into the repository root. A
    relative one resolved against each cell's working folder, not the caller's."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": paths.ROOT}
    code = "import os; from suite.config import paths; print(paths.RESULTS_DIR); print(os.environ['SUITE_RESULTS_DIR'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, "SUITE_RESULTS_DIR": "rel"},
                         capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    assert out == [str((tmp_path / "rel").resolve())] * 2  # made absolute once, and handed on so to every cell
    done = subprocess.run([sys.executable, "-m", "suite", "render"], cwd=tmp_path,
                          env={**env, "SUITE_RESULTS_DIR": ""}, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: SUITE_RESULTS_DIR is set but empty"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []  # nothing written


def _place(results: Path, key: str, machine: str, rec: dict) -> Path:
    path = store.run_path(results, key, machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


MINE = {**GOOD, "machine": {"slug": "m"}}


def test_a_record_under_another_key_or_machine_is_set_aside_never_reused(tmp_path):
    """A record copied under another cell's key made that cell `ok (cached)`; one copied into another machine's
    folder was `cached on` that machine."""
    _place(tmp_path, "k", "m", MINE)
    other_key = _place(tmp_path, "k2", "m", MINE)
    other_machine = _place(tmp_path, "k", "m2", MINE)
    seen = []
    index = Index(tmp_path)
    assert index.cell("k", "m", warn=seen.append)["key"] == "k" and seen == []
    assert index.cell("k2", "m", warn=seen.append) is None and index.cell("k", "m2", warn=seen.append) is None
    assert str(other_key) in seen[0] and "its key 'k' is not its file's name 'k2'" in seen[0]
    assert str(other_machine) in seen[1] and "its machine 'm' is not its folder's 'm2'" in seen[1]
    assert [r["machine"]["slug"] for r in index.records(warn=lambda _: None)] == ["m"]


def test_a_sweep_field_that_is_a_path_writes_nothing_outside_the_results_folder(tmp_path):
    """`--force` over a record whose sweep held `x/../../..` wrote the old record outside the results folder."""
    results = tmp_path / "results"
    evil = "x/../../../../outside"
    _place(results, "k", "m", {**MINE, "sweep": evil})
    assert "sweep 'x/../../../../outside' is not a plain name" in " ".join(problems({**MINE, "sweep": evil}))
    store.save(results, "k", "m", {**MINE, "sweep": "s2"})
    assert Index(results).cell("k", "m")["sweep"] == "s2"
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == ["k.json"]  # nothing kept, nowhere else
    with pytest.raises(ValueError, match="is not a plain name"):
        store.run_path(results, "k", "../../m")


def test_a_figure_listing_that_leads_out_of_the_figures_folder_removes_nothing_there(tmp_path):
    from suite.commands.sweep import _figures_dropped
    from suite.core.experiment import get_experiment

    exp = get_experiment("table2")
    outside = tmp_path / "keep.md"
    outside.write_text("mine")
    listing = tmp_path / "results" / "figures" / "written" / "table2.txt"
    listing.parent.mkdir(parents=True)
    listing.write_text("../../keep.md\n.\nwritten\n")  # (a folder's own name crashed the removal)
    said = []
    assert _figures_dropped(exp, tmp_path / "results", [], said.append) == []
    assert outside.read_text() == "mine" and len(said) == 3 and all("not a figure in" in x for x in said), said


def test_a_partial_record_of_another_code_is_set_aside_with_a_note_not_dropped(tmp_path):
    """A partial record (1 of 2 rounds) resumed after a code edit lost its measured round without a word."""

    def partial(code, sweep):
        rnd = {"status": "ok", "metrics": {"throughput": 10.0}, "provenance": {"code": code}}
        return {**MINE, "status": "partial: 1/2 rounds", "sweep": sweep, "provenance": {"code": code},
                "round_records": [rnd]}  # fmt: skip

    store.save(tmp_path, "k", "m", partial("c0", "s1"))
    store.save(tmp_path, "k", "m", partial("c0", "s1"))  # the same code resumes it: nothing set aside
    earlier = store.run_path(tmp_path, "k", "m").parent / store.EARLIER
    assert not earlier.exists()
    store.save(tmp_path, "k", "m", partial("c1", "s2"))  # measured anew by another code
    (aside,) = earlier.iterdir()
    kept = json.loads(aside.read_text())
    assert aside.name == "k.s1.partial-c0.json" and kept["round_records"] == partial("c0", "s1")["round_records"]
    assert kept["set_aside"].startswith("replaced by a record of code c1")
    index = Index(tmp_path)
    seen = []
    assert index.files[aside].record["set_aside"] == kept["set_aside"] and index.files[aside].warning is None
    assert index.history(index.cell("k", "m", warn=seen.append)) == [] and seen == []  # evidence, not a figure
    assert index.kept("k", "m") == []  # a reference is an `ok` record; a set-aside partial is none
