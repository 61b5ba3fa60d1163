"""The `projected` cell kind and the 2BW Figures 6-9 experiments: cells, planner agreement, projected shapes."""

import pytest

from experiments import fig6_2bw, fig7_2bw, fig8_2bw, fig9_2bw
from methods.pipeline.planner.costmodel import DEVICE_SPECS, analytic_profile
from methods.pipeline.planner.predict import predict
from methods.pipeline.planner.projection import (
    ProjectedOOM,
    extended_profile,
    fastest_fitting,
    max_layers,
    paper_profile,
    project,
)
from suite.commands.sweep import sweep
from suite.core import cell as cell_mod
from suite.core import launcher
from suite.core.request import SweepRequest


@pytest.fixture(autouse=True)
def _no_profile_measuring(monkeypatch):
    """Fig 9's measured rows need this host's profile; the tests fix the prediction instead."""
    monkeypatch.setattr(fig9_2bw, "predicted_max", lambda profile, d, w: 3)


def _cells(exp):
    return {c.row.name: c for c in exp.EXPERIMENT.cells("tiny")}


def _metrics(run):
    try:
        return project(run)
    except ProjectedOOM as exc:
        return {**exc.metrics, "oom": True}


@pytest.mark.parametrize("exp", [fig6_2bw, fig7_2bw, fig8_2bw, fig9_2bw])
def test_experiment_expands_to_measured_and_projected_cells(exp):
    cells = _cells(exp)
    kinds = {c.kind for c in cells.values()}
    assert kinds == {"throughput", "projected"}
    for c in cells.values():
        if c.kind == "projected":
            assert c.run.options["projection"]["method"] in ("gpipe", "pipedream-flush", "pipedream-2bw", "mp")
            assert c.run.options.get("executor", "reference") == "reference"  # one process, nothing trained
        elif c.run.method.startswith("torch-"):  # a peer: torch's schedule, one rank per stage by construction
            assert "executor" not in c.run.options and c.row.labels["source"] == "measured"
        else:
            assert c.run.options["executor"] == "dist" and c.row.labels["source"] == "measured"
    assert len({c.key for c in cells.values()}) == len(cells)


def test_projected_cell_equals_the_planner():
    c = _cells(fig7_2bw)["projected-pipedream-2bw-B32-rc1"]
    prof = analytic_profile(40, 2048, 16, 512, 51200, DEVICE_SPECS["v100"])
    want = predict(prof, "pipedream-2bw", 8, 1, 1, 32, True)
    got = project(c.run)
    assert got["throughput"] == pytest.approx(want.throughput)
    assert got["memory_worst_rank_gb"] == pytest.approx(want.memory / 1e9)
    assert got["stage_memory"] == pytest.approx(want.stage_memory)
    c6 = _cells(fig6_2bw)["projected-2.2B-pipedream-flush-B64"]
    pick = fastest_fitting(paper_profile(c6.run, DEVICE_SPECS["v100"], 8, 1), "pipedream-flush", 8, 1, 64, True, 16e9)
    assert project(c6.run)["throughput"] == pytest.approx(pick.throughput) and project(c6.run)["b"] == pick.b


def test_over_the_cap_is_oom_with_the_predicted_memory():
    c = _cells(fig7_2bw)["projected-gpipe-B64-rc0"]
    rec = cell_mod.execute(c.resolved())
    assert rec["status"] == "oom"
    assert rec["metrics"]["memory_worst_rank_gb"] > 16 and "throughput" not in rec["metrics"]


def test_fig6_projection_orders_2bw_flush_gpipe_at_low_batch():
    cells = _cells(fig6_2bw)
    t = {
        s: project(cells[f"projected-2.2B-{s}-B64"].run)["throughput"]
        for s in ("gpipe", "pipedream-flush", "pipedream-2bw", "mp")
    }
    assert t["pipedream-2bw"] >= t["pipedream-flush"] >= t["gpipe"] > t["mp"]


def test_fig7_projection_memory_order_at_the_papers_batch():
    cells = _cells(fig7_2bw)
    mem = {
        s: _metrics(cells[f"projected-{s}-B64-rc0"].run)["memory_worst_rank_gb"]
        for s in ("gpipe", "pipedream-flush", "pipedream-2bw", "mp")
    }
    assert mem["gpipe"] > 16 > mem["pipedream-2bw"] > mem["pipedream-flush"] > mem["mp"]


def test_fig8_projection_rises_with_batch_and_larger_b_wins_at_d8():
    cells = _cells(fig8_2bw)
    t = {
        (d, b, B): project(cells[f"projected-d{d}-b{b}-B{B}"].run)["throughput"]
        for d, b in fig8_2bw.PROJECTED
        for B in fig8_2bw.PROJECTED_BATCHES
        if f"projected-d{d}-b{b}-B{B}" in cells
    }
    for d, b in fig8_2bw.PROJECTED:
        series = [v for (dd, bb, _), v in sorted(t.items()) if (dd, bb) == (d, b)]
        assert series == sorted(series)
    assert t[(8, 32, 4096)] > t[(8, 16, 4096)]


def test_fig9_projection_max_model_non_decreasing_in_depth():
    cells = _cells(fig9_2bw)
    sizes = [project(cells[f"projected-d{d}"].run)["max_params_billion"] for d in fig9_2bw.DEPTHS]
    assert sizes == sorted(sizes) and sizes[-1] > 10 * sizes[0]


def test_max_layers_is_the_last_count_that_fits():
    prof = analytic_profile(4, 256, 4, 128, 1000, DEVICE_SPECS["v100"])
    make = lambda n: extended_profile(prof, n)  # noqa: E731
    cap = predict(make(37), "pipedream-2bw", 2, 1, 2, 2, False).memory + 1
    assert max_layers(make, "pipedream-2bw", 2, 1, 2, 2, False, cap) == 37


@pytest.mark.slow  # the projected cells are checked above; this renders a whole sweep's table and figure
def test_sweep_writes_table_and_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "run_cell", lambda c, timeout=None: cell_mod.execute(c.resolved()))
    for exp in (fig6_2bw, fig7_2bw, fig8_2bw, fig9_2bw):
        only = [n for n, c in _cells(exp).items() if c.kind == "projected"]
        records = sweep(
            SweepRequest(exp.EXPERIMENT, "tiny", only=only, wandb_mode="off", results_dir=tmp_path),
            progress=lambda *_: None,
        )
        assert all(r["status"] in ("ok", "oom") for r in records)
        assert (tmp_path / f"{exp.EXPERIMENT.name}.md").exists()
        assert (tmp_path / "figures" / f"{exp.EXPERIMENT.name}.png").exists()
    assert "| oom |" in (tmp_path / "2bw-fig7.md").read_text()
