"""Measurement: the CPU live-bytes tracker follows allocations and frees, and enforces a cap."""

import pytest
import torch

from suite.config.run import RunConfig
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.measure.memory import LiveBytesTracker
from suite.measure.step import measure


def test_tracker_counts_live_storages_not_views():
    with LiveBytesTracker() as t:
        a = torch.ones(1000)  # 4000 bytes
        v = a.view(10, 100)  # a view: no new storage
        b = torch.ones(500)  # 2000 bytes
        assert t.live == 6000
        del b
        assert t.live == 4000
    assert t.peak == 6000
    del a, v


def test_tracker_ignores_views_and_in_place_ops_on_older_storage():
    w = torch.ones(100, 100)
    with LiveBytesTracker() as t:
        w.t()
        w.add_(1.0)
        w[:10].zero_()
        assert t.live == 0
        y = w @ w  # a real allocation
        assert t.live == 40000
    del y


def test_tracker_cap_raises_out_of_memory():
    with pytest.raises(torch.OutOfMemoryError, match="cap"):
        with LiveBytesTracker(limit=1000):
            torch.ones(1000)


def test_measure_reports_throughput_and_memory():
    run = RunConfig(micro_batch_size=2, num_micro_batches=2, steps=2, warmup=1).validate()
    method = build_method(run, torch.device("cpu"))
    m = measure(method, synthetic_batches(run), run.warmup, run.steps, torch.device("cpu")).summary()
    assert m["timed_steps"] == 2 and m["throughput"] > 0 and m["samples_per_step"] == 4
    assert m["memory_kind"].startswith("cpu live-bytes")
    params = sum(p.numel() * 4 for p in method.params)
    # weights + LAMB state (2x) are resident; gradients (1x) and activations come on top
    assert m["device_peak_allocated"] > 4 * params
    assert m["host_peak_gb"] > 0
