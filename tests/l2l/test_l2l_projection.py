"""The L2L projection: the relay's schedule replayed with stated costs behaves as the relay does."""

import dataclasses

import pytest

from experiments.l2l_projection import held_to, projected_cell
from methods.l2l.projection import DEVICES, project, relay_of
from suite.config.run import ModelConfig, RunConfig


def _run(u=1, precision="fp16", layers=24, **options):
    return RunConfig(
        method="l2l" if precision == "fp32" else "l2l-cmp",
        precision=precision,
        model=ModelConfig(preset="bert-large", layers=layers),
        seq_len=512,
        micro_batch_size=64,
        num_micro_batches=u,
        options={"overlap": "on", "stash": "cpu", **options},
    )


def test_a_fast_host_and_link_leave_the_device_computing():
    p = project(relay_of(_run(4), DEVICES["gh200"], "fused"))
    assert p.bound == "compute" and p.busy > 0.95
    assert p.step_s == pytest.approx(p.compute_s, rel=0.05)


def test_the_inner_loop_amortises_a_slow_host():
    runs = [project(relay_of(_run(u), DEVICES["h100"], "foreach")) for u in (1, 2, 4)]
    assert runs[0].bound == "host" and [r.busy for r in runs] == sorted(r.busy for r in runs)
    assert runs[2].throughput > 1.5 * runs[0].throughput


def test_schedules_order_as_the_relay_does():
    spec = DEVICES["h100"]
    off = project(relay_of(_run(1, overlap="off"), spec, "foreach"))
    gated = project(relay_of(_run(1), spec, "foreach"))  # fp16: behind the verdict
    ungated = project(relay_of(_run(1, precision="bf16"), spec, "foreach"))
    assert off.step_s > gated.step_s >= ungated.step_s
    # Algorithm 2 leaves the device idle for the whole host update after the backward
    assert off.step_s == pytest.approx(off.compute_s + off.host_s, rel=0.05)


def test_a_slow_link_shows_as_upload_bound():
    slow = dataclasses.replace(DEVICES["h100"], h2d_gbps=0.5, d2h_gbps=0.5)
    p = project(relay_of(_run(1, precision="bf16"), slow, "fused"))
    assert p.bound in ("upload", "download") and p.busy < 0.5


def test_the_cell_holds_a_row_to_its_reference():
    run = dataclasses.replace(
        _run(1, overlap="off"),
        options={
            "overlap": "off",
            "stash": "cpu",
            "projection": {
                "device": "v100",
                "host_optim": "paper",
                "gpus": 4,
                "reference": {"source": "paper", "value": 52.48, "what": "Table 2"},
            },
        },
    )
    m = projected_cell(run, None, None)
    assert "reference" not in m  # the cell projects; what it is held to is read when the table is rendered
    m |= held_to(run, m, None)
    assert m["error"] == pytest.approx((m["throughput"] - 52.48) / 52.48)
    assert m["throughput"] == pytest.approx(4 * 64 / m["step_time"])
    assert set(m["assumptions"]) == {"tflops", "link", "host"}


def test_gpus_sharing_a_host_pay_its_sum_of_their_gradients_before_each_update():
    """Four relays on one host: the host sums three further gradients per parameter (gradient read at the wire's
    precision, the FP32 sum read and written) at its bandwidth; one GPU pays nothing."""
    spec = DEVICES["v100"]
    one, four = (relay_of(_run(1, overlap="off"), spec, "paper", gpus) for gpus in (1, 4))
    extra = [b - a for a, b in zip(one.prepare_s, four.prepare_s)]
    params = sum(one.params)
    assert sum(extra) == pytest.approx(3 * params * (2 + 8) / (spec.reduce_gbps * 1e9))
    assert project(four).step_s == pytest.approx(project(one).step_s + sum(extra), rel=1e-6)  # Algorithm 2: serial


def test_a_record_reference_is_held_to_its_steps_spread(monkeypatch):
    from experiments import l2l_projection
    from methods.l2l import projection

    monkeypatch.setattr(l2l_projection, "reference", lambda ref, run, index: (40.0, "a record", (30.0, 45.0)))
    run = dataclasses.replace(
        _run(1), options={**_run(1).options, "projection": {"device": "h100", "reference": {"source": "record"}}}
    )
    m = projected_cell(run, None, None)
    m |= l2l_projection.held_to(run, m, None)
    inside = 30.0 <= m["throughput"] <= 45.0
    assert m["reference_range"] == [30.0, 45.0]
    assert m["error_to_spread"] == (0.0 if inside else pytest.approx((m["throughput"] - 45.0) / 45.0))
    assert projection.outside(50.0, (30.0, 45.0)) == pytest.approx(5 / 45)
    assert projection.outside(27.0, (30.0, 45.0)) == pytest.approx(-0.1)
    assert projection.outside(31.0, (30.0, 45.0)) == 0.0


def test_a_record_reference_takes_the_harness_it_names_the_run_it_projects_and_the_latest(tmp_path):
    """The first GPU run's records say nothing of their harness; today's do (provenance.harness). A row held to the
    first run keeps its record when a GPU of the same kind commits new ones; a row held to today's takes the newest
    finished one that ran the projected run: not a `--set` variant of the row, nor another shape or setting."""
    from experiments import l2l_projection
    from suite.records import store
    from suite.records.index import Index

    run = _run(1)  # fp16, 24 layers, one micro-batch of 64, overlap on, stash on the host
    same = {
        "method": run.method,
        "precision": "fp16",
        "micro_batch_size": 64,
        "num_micro_batches": 1,
        "model": {"layers": 24},
        "options": {"overlap": "on", "stash": "cpu"},
    }

    def rec(slug, throughput, finished, harness, status="ok", variant="", **changed):
        return {
            "key": f"k{throughput}",
            "method": run.method,
            "device_type": "cuda",
            "machine": {"slug": slug},
            "experiment": "table3",
            "row": "l2l-cmp-u1",
            "profile": "paper",
            "status": status,
            "variant": variant,
            "config": {"run": {**same, **changed}},
            "metrics": {"throughput": throughput},
            "finished": finished,
            "provenance": {"harness": {"dropout": {}}} if harness else {},
        }

    records = [
        rec("h100-79gb", 48.9, "2026-11-23", False, status="partial: 1/3 rounds"),
        rec("h100-79gb", 60.0, "2026-12-01", True),
        rec("h100-79gb", 62.0, "2026-12-02", True, status="partial: 2/3 rounds"),  # newer, unfinished
        rec("h100-79gb", 99.0, "2026-12-03", True, variant="steps=9"),  # a --set variant of the row
        rec("h100-79gb", 98.0, "2026-12-03", True, options={"overlap": "off", "stash": "cpu"}),  # another setting
        rec("h200-140gb", 70.0, "2026-12-03", True),
    ]
    for r in records:
        store.save(tmp_path, r["key"], r["machine"]["slug"], r)
    index = Index(tmp_path)

    def ref(machine, harness, run=run):
        got = {"source": "record", "machine": machine, "experiment": "table3", "row": "l2l-cmp-u1", "harness": harness}
        return l2l_projection.reference(got, run, index)

    assert ref("h100-79gb", "first")[:2] == (48.9, "h100-79gb record table3/l2l-cmp-u1")
    assert ref("h100-79gb", "current")[:2] == (60.0, "h100-79gb record table3/l2l-cmp-u1")
    assert ref("h200-", "current")[0] == 70.0 and ref("h200-", "first")[0] is None
    assert ref("h200-", "current", _run(2))[0] is None  # two micro-batches: no record ran that
    assert ref("a100-", "current")[1] == "no a100 record of table3/l2l-cmp-u1 by today's harness"


def test_a_projection_is_held_to_the_records_of_the_day_it_is_rendered():
    """The projection's record keeps its projection only; its reference and error are read as its table is rendered,
    so a record committed after the projection (the H100's Table 3 rows of today's harness) is what it is held to,
    flagged where that record is suspect (issue 62)."""
    from pathlib import Path

    from suite.core.experiment import get_experiment
    from suite.records.index import Index
    from suite.report import tables

    results = Path(__file__).resolve().parents[2] / "results"
    secs = tables.sections(get_experiment("l2l-projection"), results, warn=lambda _: None)
    rows = {c.row.name: r for _, cells, records in secs for c, r in zip(cells, records) if r}
    got = rows["h100-now-t3-cmp-u1"]["metrics"]
    latest = Index(results).latest("table3", "l2l-cmp-u1", "h100-")
    assert got["reference"] == latest["metrics"]["throughput"]
    assert got["error"] == pytest.approx((got["throughput"] - got["reference"]) / got["reference"])
    assert "suspect (" in got["reference_of"]
