"""Counts made before the GPU is lent (suite.core.precount): made here for CUDA, taken by a sweep in place of counting
again where the code and versions match, counted again where they do not, and costed nothing by the estimate."""

import json

import pytest
from test_runner import TINY, make_experiment

from suite.commands.campaign import precounting, stages
from suite.commands.campaign.stages import Stage, Sweep
from suite.commands.sweep import sweep
from suite.core import precount
from suite.core.experiment import Row
from suite.core.request import SweepRequest
from suite.measure.provenance import versions

CAPPED = {**TINY, "device_memory": "64MiB"}  # the tiny model fits under it


@pytest.fixture(autouse=True)
def _this_machine(monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")


def _exp():
    exp = make_experiment([Row("a", "grad_accum", CAPPED), Row("b", "amp", {**CAPPED, "precision": "bf16"})])
    exp.name = "precount-test"
    return exp


def _sweep(tmp_path, exp, seen):
    req = SweepRequest(exp, "tiny", results_dir=tmp_path, wandb_mode="off", rounds=1, precount=True)
    return sweep(req, progress=seen.append)


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_a_stored_count_is_taken_where_code_and_versions_match_and_counted_again_where_not(tmp_path):
    exp = _exp()
    a, b = exp.cells("tiny", None, None, None)
    stored = {"status": "oom", "metrics": {"memory_kind": "counted"}, "error": "stored"}
    prov = {"torch": versions()[0], "transformers": versions()[1]}
    # a's stored count says oom (it fits: only the stored count can say so); b's was made by other code.
    precount.save(tmp_path, a, {**stored, "provenance": {**prov, "code": precount.count_of(a).code["code"]}})
    precount.save(tmp_path, b, {**stored, "provenance": {**prov, "code": "0" * 16}})
    assert precount.load(tmp_path, a, *prov.values())["status"] == "oom"
    assert precount.load(tmp_path, a, "2.0.0", prov["transformers"]) is None  # another torch
    assert precount.load(tmp_path, b, *prov.values()) is None
    seen: list[str] = []
    ra, rb = _sweep(tmp_path, exp, seen)
    assert ra["status"] == "oom" and "before" in ra["metrics"]["memory_kind"]
    assert rb["status"] == "ok"  # counted again here: it fits, so it ran
    assert any("1 of 2 capped cell(s) counted before" in m for m in seen)
    assert not any("] a" in m and "running" in m for m in seen)


def test_the_precount_counts_each_capped_cell_as_cuda_has_it_without_cuda(tmp_path, monkeypatch):
    """`campaign --precount` counts each capped cell of its stages with device=cuda on a machine without CUDA,
    stores it, and a second call finds nothing left to count."""
    exp = _exp()
    monkeypatch.setattr(precounting, "get_experiment", lambda name: exp)
    monkeypatch.setattr(stages, "STAGES", {2: Stage("t", sweeps=(Sweep("precount-test"),))})
    seen: list[str] = []
    assert precounting.precount_stages("2", results_dir=tmp_path, timeout=300, progress=seen.append) == 0
    cells = exp.cells("paper", None, ["device=cuda"], None)  # the campaign's profile
    mine = versions()
    for cell in cells:
        got = precount.load(tmp_path, cell, *mine)
        assert got is not None and got["status"] == "ok" and got["metrics"]["memory_gb"] > 0, got
        assert json.loads((tmp_path / precount.FOLDER / f"{precount.count_of(cell).key}.json").read_text())["row"]
    assert cells[0].run.device == "cuda" and cells[0].key != exp.cells("paper", None, None, None)[0].key
    seen.clear()
    assert precounting.precount_stages("2", results_dir=tmp_path, timeout=300, progress=seen.append) == 0
    assert "0 capped cell(s)" in seen[0]
