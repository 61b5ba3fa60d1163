"""Counting (#12, first step): a method's step on fake tensors counts what the same tracker sees on real ones."""

import pytest
import torch

from suite.config.run import RunConfig
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.measure.counting import CUDA_BLOCK, count
from suite.measure.memory import LiveBytesTracker

CASES = [("grad_accum", "fp32", {}), ("amp", "bf16", {}), ("l2l", "fp32", {"stash": "cpu"}), ("l2l-cmp", "bf16", {})]


def _run(method, precision, options):
    return RunConfig(
        method=method, precision=precision, micro_batch_size=4, num_micro_batches=2, seq_len=32, options=options
    ).validate()


def _measured(run) -> int:
    """The CPU measurement's figure: resident bytes plus one tracked step after a warm-up step."""
    torch.manual_seed(0)
    method = build_method(run, torch.device("cpu"))
    batches = synthetic_batches(run, padded=False)
    method.step(next(batches))
    with LiveBytesTracker() as tracker:
        method.step(next(batches))
    return method.resident_device_bytes() + tracker.peak


@pytest.mark.parametrize("method,precision,options", CASES)
def test_counted_peak_matches_the_tracker_on_real_tensors(method, precision, options):
    run = _run(method, precision, options)
    counted = count(lambda: build_method(run, torch.device("cpu")), lambda: synthetic_batches(run, padded=False))
    real = _measured(run)
    assert counted["device_peak_allocated"] == pytest.approx(real, rel=0.01), (counted, real)
    assert counted["resident_bytes"] > 0 and counted["step_peak_bytes"] > 0


def test_rounding_to_the_allocator_block_only_adds():
    run = _run("grad_accum", "fp32", {})
    plain = count(lambda: build_method(run, torch.device("cpu")), lambda: synthetic_batches(run, padded=False))
    rounded = count(
        lambda: build_method(run, torch.device("cpu")),
        lambda: synthetic_batches(run, padded=False),
        round_to=CUDA_BLOCK,
    )
    assert plain["step_peak_bytes"] < rounded["step_peak_bytes"] < plain["step_peak_bytes"] * 1.5
