"""Device memory against depth (CPU live-bytes tracker): flat with stash=cpu, +1 activation per layer with stash=gpu."""

import pytest

from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.measure.memory import LiveBytesTracker

DEPTHS = (4, 8, 16, 32)
HIDDEN, SEQ, MICRO_BATCH, MICRO_BATCHES = 16, 16, 2, 2


def _peak(layers: int, method: str = "l2l", **options) -> tuple[int, int, int]:
    """(tracked step peak + resident bytes, resident bytes, bytes of one block's parameters)."""
    run = RunConfig(
        method=method,
        device="cpu",
        seq_len=SEQ,
        micro_batch_size=MICRO_BATCH,
        num_micro_batches=MICRO_BATCHES,
        options=options,
        model=ModelConfig(layers=layers, hidden=HIDDEN, heads=2, intermediate=2 * HIDDEN, vocab_size=128, max_seq=SEQ),
    ).validate()
    m = build_method(run)
    batches = synthetic_batches(run, padded=True)
    m.step(next(batches))  # first-step allocations (host stash buffers) are not the steady state
    resident = m.resident_device_bytes()
    with LiveBytesTracker() as tracker:
        m.step(next(batches))
    block = sum(p.numel() * p.element_size() for p in m.model.layers[1].parameters())
    return tracker.peak + resident, resident, block


def test_stash_cpu_device_memory_does_not_grow_with_depth():
    peaks = {n: _peak(n, stash="cpu") for n in DEPTHS}
    block = peaks[DEPTHS[0]][2]
    totals = [p[0] for p in peaks.values()]
    assert max(totals) - min(totals) < block, {n: p[0] for n, p in peaks.items()}
    assert len({p[1] for p in peaks.values()}) == 1  # the slots do not depend on depth either


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_stash_gpu_grows_by_one_boundary_activation_per_layer(overlap):
    peaks = {n: _peak(n, stash="gpu", overlap=overlap)[0] for n in DEPTHS}
    per_layer = (peaks[DEPTHS[-1]] - peaks[DEPTHS[0]]) / (DEPTHS[-1] - DEPTHS[0])
    activation = MICRO_BATCH * MICRO_BATCHES * SEQ * HIDDEN * 4  # FP32 input of one block, all micro-batches
    # Nothing else the step allocates outlives its layer, so the slope is that stash alone; 10%
    # leaves room for allocator-independent bookkeeping while a second tensor per layer (+100%)
    # or a missing stash (-100%) falls far outside.
    assert abs(per_layer - activation) <= 0.1 * activation, (per_layer, activation, peaks)


def test_tracker_sees_depth_where_there_is_some():
    # The instrument itself: grad_accum keeps every layer's weights, gradients and optimizer state.
    small, _, block = _peak(DEPTHS[0], "grad_accum")
    large, _, _ = _peak(DEPTHS[1], "grad_accum")
    assert (large - small) / (DEPTHS[1] - DEPTHS[0]) > 2 * block
