"""Every traced L2L step's timeline: the device's compute and its waits add up to the step, a slow host shows as
waits for the host and skipped prefetches, and the measurement and the table carry the device's busy share."""

import time

import pytest
import torch

from methods.l2l.timeline import breakdown, gaps
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.measure.step import measure
from suite.report import tables

PARTS = ("upload_wait_ms", "stash_wait_ms", "host_wait_ms")


def _method(**kw):
    run = RunConfig(
        method=kw.pop("method", "l2l"),
        device="cpu",
        model=ModelConfig(layers=4),
        seq_len=16,
        micro_batch_size=2,
        num_micro_batches=2,
        options=kw.pop("options", {}),
        **kw,
    ).validate()
    return build_method(run)


def test_idle_time_is_split_by_what_the_device_waited_for():
    assert gaps([(1, 2), (1.5, 3), (5, 6)], 8) == [(0, 1), (3, 5), (6, 8)]
    spans = [("forward", 1, 0, 4), ("upload", 2, 3, 6), ("stash-up", 1, 5, 7), ("backward", 2, 8, 10)]
    parts = breakdown(spans, wall_ms=10, host_ms=2)
    # idle 4..8: an upload covers 4..6, then the stash's copy 6..7, then nothing (the host) 7..8
    assert (parts["upload_wait_ms"], parts["stash_wait_ms"], parts["host_wait_ms"]) == (2, 1, 1)
    assert parts["device_busy"] == 0.6 and parts["stash_copy_ms"] == 2


@pytest.mark.parametrize("options", [dict(overlap="on", stash="cpu"), dict(overlap="off", stash="gpu")])
def test_every_step_has_a_timeline_whose_parts_add_up(options):
    m = _method(options=options)
    batches = synthetic_batches(m.run)
    for _ in range(2):
        m.step(next(batches))
        tl = m.timeline()
    assert tl["compute_ms"] > 0 and 0 < tl["device_busy"] <= 1
    assert tl["compute_ms"] + sum(tl[k] for k in PARTS) == pytest.approx(tl["wall_ms"])
    assert tl["upload_ms"] > 0 and tl["host_commit_ms"] > 0
    assert (tl["stash_copy_ms"] > 0) == (options["stash"] == "cpu")


def test_a_slow_host_shows_as_waits_for_the_host_and_skipped_prefetches():
    m = _method(method="l2l-cmp", precision="fp16", options=dict(overlap="on"))
    commit = m.server.commit

    def slow_commit(*args):
        time.sleep(0.02)
        commit(*args)

    m.server.commit = slow_commit
    batches = synthetic_batches(m.run)
    m.step(next(batches))
    m.timeline()
    m.step(next(batches))  # its forward waits for the first step's commits, queued behind the fp16 verdict
    tl = m.timeline()
    assert tl["skipped_prefetches"] >= 1
    assert tl["host_wait_ms"] >= 20 and tl["host_wait_ms"] > tl["compute_ms"] / 2, tl
    assert tl["host_commit_ms"] > 0  # the commits themselves (the sleep is outside what the server times)


def test_measurement_and_table_carry_the_device_busy_share():
    m = _method(options=dict(overlap="on"))
    summary = measure(m, synthetic_batches(m.run), 1, 3, torch.device("cpu")).summary()
    assert summary["timeline"]["steps"] == 3 and 0 < summary["device_busy"] <= 1
    plain = build_method(RunConfig(method="grad_accum", device="cpu", model=ModelConfig(layers=2)).validate())
    assert "device_busy" not in measure(plain, synthetic_batches(plain.run), 0, 1, torch.device("cpu")).summary()
    assert tables.has_busy([None, {"metrics": summary}]) and not tables.has_busy([{"metrics": {"throughput": 1.0}}])
    # On a CPU the device is the host: the share is recorded, and the table shows no device busy column for it
    assert not tables.has_busy([{"device_type": "cpu", "metrics": summary}])


def test_the_device_busy_column_holds_each_rows_share():
    from suite.core.experiment import get_experiment

    exp = get_experiment("table2")
    cells = exp.cells("tiny", None, None, None)
    records = [
        {"status": "ok", "sweep": "s", "metrics": {"throughput": 10.0 + i, "device_busy": 0.5 + i / 100}}
        for i in range(len(cells))
    ]
    names, rows = tables.table_rows(exp, cells, records)
    assert len(names) == len(rows[0])
    at = names.index("device busy")
    assert [r[at] for r in rows] == [0.5 + i / 100 for i in range(len(cells))]
    assert [r[at - 2] for r in rows] == [10.0 + i for i in range(len(cells))]  # beside its throughput and spread
