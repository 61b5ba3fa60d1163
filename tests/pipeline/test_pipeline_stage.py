"""Stage: forward/backward of one micro-batch reproduce the whole model's gradients, with or without recompute."""

import pytest
import torch

from methods.pipeline.executors.stage import Stage, clip_coefficient
from methods.pipeline.schedules.schedule import Action, Kind
from suite.config.run import ModelConfig, RunConfig
from suite.harness.data import synthetic_batch
from suite.harness.model import build_model

RUN = RunConfig(model=ModelConfig(layers=2, hidden=32, heads=2, intermediate=64), seq_len=8, device="cpu").validate()


def _batch():
    return synthetic_batch(0, 4, RUN.seq_len, RUN.model.vocab_size, RUN.model.num_labels, RUN.seed, padded=True)


def _reference_grads():
    model = build_model(RUN.model, RUN.seed)
    batch = _batch()
    model.forward_micro_batch(model.begin(batch, RUN.seed, 0, 8)).backward()
    return {n: p.grad.clone() for n, p in model.hf.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("cut", [1, 2, 3])
def test_two_stages_reproduce_whole_model_gradients_bitwise(recompute, cut):
    want = _reference_grads()
    model = build_model(RUN.model, RUN.seed)
    n = model.num_layers
    a = Stage(model, range(0, cut), 0, torch.device("cpu"), recompute, RUN)
    b = Stage(model, range(cut, n), 1, torch.device("cpu"), recompute, RUN)
    batch = _batch()
    ctx = model.begin(batch, RUN.seed, 0, 8)
    act = a.forward((0, 0), batch, ctx)
    assert not act.requires_grad  # what is sent carries no graph
    loss = b.forward((0, 0), act, ctx)
    assert b.loss.item() == loss.item()
    # With recompute only the input is stashed; without, the output and its graph too.
    assert (a.stash[0, 0][2] is None) == recompute and (b.stash[0, 0][2] is None) == recompute
    grad = b.backward((0, 0), None)
    assert grad.shape == a.boundary_shape(ctx) == act.shape
    assert a.backward((0, 0), grad) is None
    got = {n: p.grad for n, p in model.hf.named_parameters()}
    for name, g in want.items():
        assert torch.equal(got[name], g), name
    assert not a.stash and not b.stash and a.peak[0] == 1 and a.live[0] == 0


def test_stash_misuse_and_version_rule_are_refused():
    model = build_model(RUN.model, RUN.seed)
    st = Stage(model, range(0, model.num_layers), 0, torch.device("cpu"), False, RUN)
    batch = _batch()
    ctx = model.begin(batch, RUN.seed, 0, 8)
    with pytest.raises(RuntimeError, match="without its forward"):
        st.backward((0, 0), None)
    st.forward((0, 0), batch, ctx)
    with pytest.raises(RuntimeError, match="forwarded twice"):
        st.forward((0, 0), batch, ctx)
    st.check_version(Action(Kind.FORWARD, 0, 0, 0))
    with pytest.raises(RuntimeError, match="weight version 1"):
        st.check_version(Action(Kind.FORWARD, 0, 8, 1))


def test_update_steps_every_layer_and_clip_matches_torch():
    model = build_model(RUN.model, RUN.seed)
    st = Stage(model, range(0, model.num_layers), 0, torch.device("cpu"), False, RUN)
    batch = _batch()
    st.forward((0, 0), batch, model.begin(batch, RUN.seed, 0, 8))
    st.backward((0, 0), None)
    grads = [p.grad.clone() for p in st.params]
    coef = clip_coefficient(st.grad_sq_norm(), 0.01)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    assert coef.item() == pytest.approx(min(1.0, 0.01 / (norm.item() + 1e-6)), rel=1e-5)
    before = [p.detach().clone() for p in st.params]
    st.scale_grads(coef)
    assert all(torch.equal(p.grad, g * coef) for p, g in zip(st.params, grads))
    moved = [bool(g.abs().max() > 1e-6) for g in grads]
    st.update(0)
    assert st.version == 1 and all(p.grad is None for p in st.params)
    assert sum(moved) > len(moved) // 2
    assert all(not torch.equal(p, b) for p, b, m in zip(st.params, before, moved) if m)
