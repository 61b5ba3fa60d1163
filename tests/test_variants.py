"""A table's rows stay the table's: a --set variant is keyed, labelled and drawn apart, and re-running some rows keeps
the ratios of the others (each to the reference of its own sweep)."""

import dataclasses

import pytest

from suite.commands.sweep import sweep
from suite.core import launcher
from suite.core.experiment import get_experiment
from suite.core.plan import expand
from suite.core.request import SweepRequest
from suite.measure.step import METHODOLOGY_VERSION
from suite.records import store
from suite.records.index import Index
from suite.report import tables

RATE = {"baseline-fp32": 10.0, "l2l-fp32": 5.0, "l2l-cmp": 20.0}


@pytest.fixture
def ran(monkeypatch):
    """Cells 'run' at once: each row at its rate in RATE (times `scale`), what ran noted."""
    monkeypatch.setenv("SUITE_MACHINE", "m")
    log = {"cells": [], "scale": 1.0}

    def run_cell(cell, timeout=None):
        log["cells"].append(cell)
        rate = RATE[cell.row.name] * log["scale"]
        prov = {"methodology": METHODOLOGY_VERSION, **cell.code}
        metrics = {"throughput": rate, "memory_gb": rate / 10}
        return {"status": "ok", "metrics": metrics, "error": None, "provenance": prov}

    monkeypatch.setattr(launcher, "run_cell", run_cell)
    return log


def _req(tmp_path, only, overrides=None, force=False):
    exp = get_experiment("table2")
    return SweepRequest(
        exp, "tiny", only=only, overrides=overrides, results_dir=tmp_path, wandb_mode="off", rounds=1, force=force
    )


def test_a_set_method_is_a_variant_keyed_and_labelled_apart_and_left_out_of_the_figures(tmp_path, ran):
    sweep(_req(tmp_path, ["l2l-cmp"]), lambda line: None)  # the table's own rows
    own = {r["row"]: r for r in Index(tmp_path).records()}
    ran["cells"].clear()
    records = {r["row"]: r for r in sweep(_req(tmp_path, ["l2l-cmp"], ["method=amp"]), lambda line: None)}
    # what ran: the row's method replaced, the reference row as the table defines it (never amp against amp)
    assert {c.row.name: c.run.method for c in ran["cells"]} == {"baseline-fp32": "grad_accum", "l2l-cmp": "amp"}
    assert records["l2l-cmp"]["method"] == "amp" and records["baseline-fp32"]["method"] == "grad_accum"
    for row in ("l2l-cmp", "baseline-fp32"):  # keyed apart: the table's own records stand untouched
        assert records[row]["key"] != own[row]["key"] and records[row]["config"]["variant"] == "set method=amp"
        assert Index(tmp_path).cell(own[row]["key"], "m")["method"] == own[row]["method"]
    titles = [t for t, _, _ in tables.sections(get_experiment("table2"), tmp_path)]
    assert titles == ["tiny profile on m (cpu device)", "tiny profile on m (cpu device), set method=amp"]
    drawn = [t for t, _, _ in tables.sections(get_experiment("table2"), tmp_path, variants=False)]
    assert drawn == titles[:1]  # the figures draw the table's own rows only
    md = (tmp_path / "table2.md").read_text()
    variant = md.split("set method=amp", 1)[1]
    assert "| l2l-cmp | amp |" in variant and "| 2.00x |" in variant  # its method named, its ratio to the table's


def test_a_shape_override_is_no_variant():
    exp = get_experiment("table2")
    (cell,) = [c for c in exp.cells("tiny", ["l2l-cmp"], ["steps=2", "seq_len=16"]) if c.row.name == "l2l-cmp"]
    plain = exp.cells("tiny", ["l2l-cmp"], ["steps=2", "seq_len=16"])[0]
    assert cell.variant == "" and "variant" not in cell.resolved() and cell.key == plain.key
    assert exp.variant_pairs(["steps=2", "precision=fp32", "stash=cpu", "method=amp"]) == [
        "precision=fp32",
        "stash=cpu",
        "method=amp",
    ]


def test_re_running_one_row_keeps_every_other_rows_ratios(tmp_path, ran):
    exp = get_experiment("table2")
    sweep(_req(tmp_path, ["l2l-fp32", "l2l-cmp"]), lambda line: None)
    first = {r["row"]: r for r in Index(tmp_path).records()}
    ran["scale"] = 2.0  # the machine twice as fast now: the re-run's ratios are its own
    sweep(_req(tmp_path, ["l2l-cmp"], force=True), lambda line: None)
    ((title, cells, records),) = tables.sections(exp, tmp_path)
    cols, rows = tables.table_rows(exp, cells, records)
    row = {r[0]: dict(zip(cols, r)) for r in rows}
    ratio, memory = "throughput xbaseline-fp32 ours", "memory_gb xbaseline-fp32 ours"
    assert row["l2l-cmp"][ratio] == pytest.approx(2.0)  # the re-run row, to the reference measured beside it
    assert row["l2l-fp32"][ratio] == pytest.approx(0.5)  # the other row, to the reference of its own sweep
    assert row["l2l-fp32"][memory] == pytest.approx(0.5)
    kept = next(iter(Index(tmp_path).kept(first["baseline-fp32"]["key"], "m", first["baseline-fp32"]["sweep"])), None)
    assert kept["metrics"]["throughput"] == 10.0 and kept["sweep"] == first["l2l-fp32"]["sweep"]
    note = (tmp_path / "table2.md").read_text()
    said = "`l2l-fp32` came from earlier sweeps and take their rate ratios to the reference measured in their own"
    assert said in note
    # a row of another sweep whose reference was not kept: its memory ratio stands, its rate ratio does not
    kept_path = store.run_path(tmp_path, first["baseline-fp32"]["key"], "m").parent / store.EARLIER
    for path in kept_path.iterdir():
        path.unlink()
    ((title, cells, records),) = tables.sections(exp, tmp_path)
    cols, rows = tables.table_rows(exp, cells, records)
    row = {r[0]: dict(zip(cols, r)) for r in rows}
    assert row["l2l-fp32"][ratio] is None and row["l2l-fp32"][memory] == pytest.approx(0.25)


def test_expand_keys_a_variants_reference_apart_from_the_tables(tmp_path):
    plain = {c.row.name: c for c in expand(_req(tmp_path, ["l2l-cmp"]))}
    variant = {c.row.name: c for c in expand(_req(tmp_path, ["l2l-cmp"], ["method=amp"]))}
    ref = "baseline-fp32"
    assert variant[ref].run == plain[ref].run and variant[ref].key != plain[ref].key
    assert dataclasses.replace(variant[ref], variant="").key == plain[ref].key
