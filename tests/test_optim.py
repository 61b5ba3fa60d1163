"""LAMB against a direct transcription of its update rule; the layerwise optimizer and LR schedule."""

import math

import pytest
import torch

from suite.config.run import RunConfig
from suite.harness.optim import Lamb, LayerwiseOptimizer, lr_at


def lamb_reference(ws, grads_per_step, lr, b1, b2, eps, wd):
    """You et al. (2019), Algorithm 2, one tensor at a time, written out literally."""
    ws = [w.clone().double() for w in ws]
    ms = [torch.zeros_like(w) for w in ws]
    vs = [torch.zeros_like(w) for w in ws]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, (w, g) in enumerate(zip(ws, grads)):
            g = g.double()
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat = ms[i] / (1 - b1**t)
            v_hat = vs[i] / (1 - b2**t)
            r = m_hat / (v_hat.sqrt() + eps)
            u = r + wd * w
            w_norm, u_norm = w.norm().item(), u.norm().item()
            trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            ws[i] = w - lr * trust * u
    return ws


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_reference(wd):
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ws = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    ws.append(torch.zeros(4, dtype=torch.float64))  # zero tensor: trust ratio falls back to 1
    grads = [[torch.randn(w.shape, generator=g, dtype=torch.float64) for w in ws] for _ in range(5)]
    params = [torch.nn.Parameter(w.clone()) for w in ws]
    opt = Lamb(params, lr=0.01, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd)
    for step_grads in grads:
        for p, gr in zip(params, step_grads):
            p.grad = gr.clone()
        opt.step()
    expected = lamb_reference(ws, grads, 0.01, 0.9, 0.999, 1e-6, wd)
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-14)


def test_lamb_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="LAMB"):
        Lamb([torch.nn.Parameter(torch.zeros(1))], lr=-1)


def test_layerwise_step_touches_only_its_layer():
    run = RunConfig(optimizer="adamw").validate()
    layers = [[(f"l{i}.weight", torch.nn.Parameter(torch.ones(3)))] for i in range(3)]
    for named in layers:
        named[0][1].grad = torch.ones(3)
    opt = LayerwiseOptimizer(layers, run)
    opt.step_layer(1, 0)
    assert torch.equal(layers[0][0][1].detach(), torch.ones(3))
    assert not torch.equal(layers[1][0][1].detach(), torch.ones(3))
    assert torch.equal(layers[2][0][1].detach(), torch.ones(3))


def test_no_weight_decay_on_bias_and_layernorm():
    run = RunConfig(optimizer="lamb", weight_decay=0.5).validate()
    named = [
        ("x.weight", torch.nn.Parameter(torch.ones(2))),
        ("x.bias", torch.nn.Parameter(torch.ones(2))),
        ("x.LayerNorm.weight", torch.nn.Parameter(torch.ones(2))),
    ]
    opt = LayerwiseOptimizer([named], run)
    decays = {id(p): g["weight_decay"] for g in opt.opts[0].param_groups for p in g["params"]}
    assert [decays[id(p)] for _, p in named] == [0.5, 0.0, 0.0]


def test_linear_schedule():
    run = RunConfig(lr=1.0, schedule="linear", warmup_steps=2, total_steps=10)
    assert [round(lr_at(run, s), 4) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert math.isclose(lr_at(RunConfig(lr=0.1), 100), 0.1)
