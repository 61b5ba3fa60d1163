"""L2L-CMP: 16-bit device copies of FP32 host masters, checked against AMP; fp16 overflow skips the whole step."""

import itertools
import math

import pytest
import torch

from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.harness.data import synthetic_batches


def tiny(precision="bf16", options=None, **kw) -> RunConfig:
    return RunConfig(
        method="l2l-cmp",
        precision=precision,
        device="cpu",
        model=ModelConfig(layers=2),
        seq_len=16,
        micro_batch_size=2,
        num_micro_batches=kw.pop("num_micro_batches", 2),
        options=options or {},
        **kw,
    )


@pytest.mark.parametrize(
    "precision,clip,overlap,stash",
    list(itertools.product(("bf16", "fp16"), (0.0, 0.05), ("off", "on"), ("gpu", "cpu"))),
)
def test_cmp_matches_amp(precision, clip, overlap, stash):
    # Every schedule of the host update (Algorithm 2, overlapped ungated, overlapped behind the fp16 or clipping
    # gate) with the stash on either side; fp16 compute runs on this CPU in torch 2.13, so the loss-scaled path
    # is exercised for real, and a clipping norm of 0.05 clips every step of this model.
    run = tiny(precision, dict(stash=stash, overlap=overlap), num_micro_batches=4, clip_grad_norm=clip)
    result = check(run, "amp", steps=3)
    assert result.passed, result.report(top=5)


def test_16_bit_weights_travel_and_compute_fp32_stays_on_the_host():
    m = build_method(tiny("bf16").validate())
    assert all(w.dtype == torch.bfloat16 for w in m.server.wire)
    assert all(g.dtype == torch.bfloat16 for g in m.server.landing)
    assert all(f.dtype == torch.float32 for f in [*m.server.flat, m.server.scratch])
    assert all(s.flat.dtype == torch.bfloat16 and s.grad.dtype == torch.bfloat16 for s in m.relay.slots)
    assert all(t.dtype == torch.float32 for t in m.server.optimizer_state())
    assert all(v.dtype == torch.float32 for v in m.state_dict().values())
    # The 16-bit copy is the rounded master and is refreshed after every update.
    m.step(next(synthetic_batches(m.run)))
    m.state_dict()
    for wire, flat in zip(m.server.wire, m.server.flat):
        assert torch.equal(wire, flat.to(torch.bfloat16))


def _snapshot(m):
    return m.state_dict(), [t.clone() for t in m.server.optimizer_state()], m.scaler.scale


def _inject_inf_into_embeddings(m):
    # The embeddings are the last layer of the backward: every other layer's gradient is finite
    # and already on the host when the overflow appears.
    weight = m.relay.embed.module.word_embeddings.weight
    return weight.register_hook(lambda g: torch.full_like(g, math.inf))


def _assert_skipped_and_untouched(m, stats, before):
    weights, state, scale = before
    assert stats.skipped
    after = m.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights), "a weight changed in a skipped step"
    assert all(torch.equal(a, b) for a, b in zip(state, m.server.optimizer_state())), (
        "optimizer state changed in a skipped step"
    )
    assert m.scaler.scale == scale * m.scaler.backoff_factor


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_fp16_overflow_in_one_layer_skips_every_update(overlap):
    m = build_method(tiny("fp16", dict(overlap=overlap)).validate())
    batches = synthetic_batches(m.run)
    assert not m.step(next(batches)).skipped  # optimizer state is non-zero from here on
    before = _snapshot(m)
    hook = _inject_inf_into_embeddings(m)
    _assert_skipped_and_untouched(m, m.step(next(batches)), before)
    hook.remove()
    stats = m.step(next(batches))
    assert not stats.skipped
    after = m.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[0][k], after[k]) for k in after)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_fp16_overflow_everywhere_skips_the_step(overlap):
    m = build_method(tiny("fp16", dict(overlap=overlap, stash="cpu")).validate())
    batches = synthetic_batches(m.run)
    m.step(next(batches))
    m.scaler.scale = 2.0**40  # the scaled loss gradient overflows fp16 already in the head
    before = _snapshot(m)
    _assert_skipped_and_untouched(m, m.step(next(batches)), before)


def test_eager_commits_would_corrupt_a_skipped_step():
    # The overflow test must be able to fail: without the gate, overlap commits the head and
    # blocks before the embeddings' overflow is seen.
    m = build_method(tiny("fp16", dict(overlap="on")).validate())
    batches = synthetic_batches(m.run)
    m.step(next(batches))
    m.updater.gated = False
    weights, _, _ = _snapshot(m)
    _inject_inf_into_embeddings(m)
    m.step(next(batches))
    after = m.state_dict()
    assert any(not torch.equal(weights[k], after[k]) for k in weights if not k.startswith("bert.embeddings"))
