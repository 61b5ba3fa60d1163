"""Counted against measured as records (issue 62, item 5): the cell kind counts and measures one run, the H200's
test report becomes records with its figures unchanged, and the README's first claim reads them."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from experiments import counted_vs_cuda
from suite.config.run import RunConfig, apply_overrides
from suite.records.index import Index

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "gpu-runs" / "2026-11-27-h200-c9bdb98"


@pytest.mark.parametrize("method", ["grad_accum", "l2l"])
def test_the_cell_counts_and_measures_one_run_on_a_cpu(method):
    """On a CPU the measured peak is the live-bytes tracker on real tensors, which the count must stand for (it
    rounds each storage to the allocator's 512 B blocks, which the tracker does not)."""
    from test_runner import TINY

    run = apply_overrides(RunConfig(method=method), {**TINY, "device": "cpu"}, {}).validate()
    m = counted_vs_cuda.count_and_measure(run, torch.device("cpu"), None)
    assert m["counted_gb"] > 0 and abs(m["counted_over_measured"] - 1) <= counted_vs_cuda.BOUND, m  # 512 B blocks
    assert m["within_bound"] == "yes" and "tracker" in m["memory_kind"]


def test_the_h200_report_becomes_records_with_its_figures(tmp_path):
    env = ROOT / "results" / "campaign" / "h200-140gb" / "environment.json"
    commit = "c9bdb98761ae3d4959843b616131d688576553ca"
    paths = counted_vs_cuda.convert(H200 / "b-counted.xml", commit, env, tmp_path)
    got = {r["row"]: r for r in Index(tmp_path).records()}
    assert set(got) == set(counted_vs_cuda.SHAPES) and len(paths) == 4
    assert got["l2l-cmp"]["metrics"]["counted_gb"] * 1e9 == 241202688  # the report's bytes, unchanged
    assert got["l2l-cmp"]["metrics"]["within_bound"] == "no"
    assert got["baseline-fp32"]["metrics"]["within_bound"] == "yes"  # a passing row: its verdict, no figures
    assert got["baseline-fp32"]["metrics"]["counted_gb"] is None
    committed = {json.loads(p.read_text())["key"] for p in (ROOT / "results" / "runs" / "h200-140gb").glob("*.json")}
    assert {r["key"] for r in got.values()} <= committed  # the committed records are these, at today's keys
    for rec in got.values():
        kept = json.loads((ROOT / "results" / "runs" / "h200-140gb" / f"{rec['key']}.json").read_text())
        assert kept["metrics"] == rec["metrics"] and kept["converted_from"] == rec["converted_from"]


def test_the_counts_claim_reads_its_verdict_from_the_records():
    from experiments.claims import counting
    from suite.report import claims

    line = claims.render(counting.CLAIMS, ROOT / "results")
    assert "not reproduced (1 of 4 rows within 5%)" in line and "l2l-cmp 0.715 (+96 MB)" in line, line
    bare = dataclasses.replace(counting.CLAIMS[0], where=dataclasses.replace(counting.CLAIMS[0].where, machine="x"))
    assert "| no records | `x`, paper, measured | not run |" in claims.render([bare], ROOT / "results")


def test_a_row_not_yet_measured_leaves_the_counts_claim_pending(tmp_path):
    """A partial sweep on a GPU (a row not run) says pending, never 'not reproduced' for the row it lacks."""
    from experiments.claims import counting
    from suite.records import store
    from suite.report import claims

    for path in (ROOT / "results" / "runs" / "h200-140gb").glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == "counted-vs-cuda" and rec["row"] != "l2l-cmp":
            store.save(tmp_path, rec["key"], "h200-140gb", rec)
    line = claims.render(counting.CLAIMS, tmp_path)
    assert "pending (l2l-cmp not measured)" in line and "l2l-cmp `not run`" in line, line
