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
    store.save(tmp_path, "k", "m", dict(GOOD))
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


def test_an_empty_results_folder_setting_is_unset_and_a_relative_one_the_callers(tmp_path):
    import os
    import subprocess
    import sys

    code = "import os; from suite.config import paths; print(paths.RESULTS_DIR); print(os.environ['SUITE_RESULTS_DIR'])"
    env = {**os.environ, "PYTHONPATH": paths.ROOT}
    for given, expect in (("", Path(paths.ROOT) / "results"), ("rel", tmp_path / "rel")):
        out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={**env, "SUITE_RESULTS_DIR": given},
                             capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
        assert Path(out[0]).resolve() == expect.resolve(), out
        # handed on absolute: a cell process in another working folder finds the same folder
        assert out[1] == (str(expect.resolve()) if given else ""), out
