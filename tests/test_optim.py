"""LAMB against a direct transcription of its update rule; the layerwise optimizer and LR schedule."""

import math
import os
from pathlib import Path

import pytest
import torch

from suite.config.run import RunConfig
from suite.harness import fused_lamb
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


# The fused host LAMB (csrc/lamb.cpp). It must build wherever the suite's setup ran (a failed build falls back
# with a warning, which these tests would show as failures); SUITE_FUSED_LAMB=0 turns it off, and them too.
fused = pytest.mark.skipif(os.environ.get("SUITE_FUSED_LAMB") == "0", reason="SUITE_FUSED_LAMB=0")
# Longer than the kernel's 16K-element chunks, one not a multiple of them, small ones, and a zero tensor.
SHAPES = [(300, 200), (70001,), (7, 5), (4,)]


def _lamb_run(fused_kernel: bool, dtype=torch.float32, steps=5, wd=0.01, threads=None):
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(s, generator=g, dtype=torch.float64) * 0.02 for s in SHAPES]
    ws[-1].zero_()
    grads = [[torch.randn(w.shape, generator=g, dtype=torch.float64) * 1e-3 for w in ws] for _ in range(steps)]
    params = [torch.nn.Parameter(w.to(dtype)) for w in ws]
    opt = Lamb(
        [dict(params=params[:2], weight_decay=wd), dict(params=params[2:], weight_decay=0.0)],
        lr=1e-3,
        eps=1e-6,
        fused=fused_kernel,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        for step_grads in grads:
            for p, gr in zip(params, step_grads):
                p.grad = gr.to(dtype)
            opt.step()
    finally:
        torch.set_num_threads(before)
    return ws, grads, [p.detach() for p in params], opt


@fused
def test_fused_lamb_is_the_algorithm_within_float_rounding():
    assert fused_lamb.kernel() is not None, (
        "the fused LAMB did not build here (the warning says why); SUITE_FUSED_LAMB=0 runs the tests without it"
    )
    ws, grads, ours, opt = _lamb_run(True)
    assert opt.fused
    # The literal transcription in float64, per group (weight decay on the first two tensors only).
    exact = lamb_reference(ws[:2], [g[:2] for g in grads], 1e-3, 0.9, 0.999, 1e-6, 0.01)
    exact += lamb_reference(ws[2:], [g[2:] for g in grads], 1e-3, 0.9, 0.999, 1e-6, 0.0)
    for p, e in zip(ours, exact):
        worst = (p.double() - e).abs().max() / e.abs().max().clamp_min(1e-30)
        assert worst <= 1e-6, f"fused LAMB is {worst:.2e} (relative) off the algorithm"
    # The foreach reference, in FP32 too, agrees with it to float rounding (its norms sum in float, ours in
    # chunks of float lanes added in double: both are within 1e-6 here).
    _, _, foreach, _ = _lamb_run(False)
    for p, q in zip(ours, foreach):
        assert (p - q).abs().max() <= 1e-6 * q.abs().max() + 1e-12


@fused
def test_fused_lamb_does_not_depend_on_the_thread_count():
    *_, one, opt = _lamb_run(True, threads=1)
    assert opt.fused
    two = _lamb_run(True, threads=2)[2]
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    assert not all(torch.equal(a, b) for a, b in zip(one, _lamb_run(False)[2]))  # and it is not the foreach path


def test_lamb_takes_the_foreach_path_where_the_kernel_cannot_go():
    # FP64 (model.double() after build) steps exactly as fused=False does; a kernel that did not build is the next test.
    ref = _lamb_run(False, dtype=torch.float64)[2]
    assert all(torch.equal(a, b) for a, b in zip(_lamb_run(True, dtype=torch.float64)[2], ref))


def test_a_failed_build_warns_and_falls_back(monkeypatch):
    from torch.utils import cpp_extension

    def broken(**kw):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setenv("SUITE_FUSED_LAMB", "1")
    fused_lamb.compiled.cache_clear()
    try:
        with pytest.warns(UserWarning, match="fused LAMB unavailable.*no compiler here"):
            opt = _lamb_run(True)[3]
        assert not opt.fused
        assert all(torch.equal(a, b) for a, b in zip(_lamb_run(True)[2], _lamb_run(False)[2]))
        monkeypatch.setenv("SUITE_FUSED_LAMB", "require")
        fused_lamb.compiled.cache_clear()
        with pytest.raises(RuntimeError, match="did not build: no compiler here"):
            fused_lamb.kernel()
    finally:
        fused_lamb.compiled.cache_clear()  # the next caller builds (or loads) the real one


@fused
@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_layerwise_optimizer_fuses_cpu_tensors_and_counts_devices_as_devices(optimizer):
    from torch._subclasses.fake_tensor import FakeTensorMode

    run = RunConfig(optimizer=optimizer).validate()

    def layers():
        return [
            [(f"l{i}.weight", torch.nn.Parameter(torch.ones(5, 3))), (f"l{i}.bias", torch.nn.Parameter(torch.ones(3)))]
            for i in range(2)
        ]

    def kinds(opt):
        return {
            "fused" if (o.fused if isinstance(o, Lamb) else o.param_groups[0]["fused"]) else "foreach" for o in opt.opts
        }

    assert kinds(LayerwiseOptimizer(layers(), run)) == {"fused"}
    assert kinds(LayerwiseOptimizer(layers(), run, impl="foreach")) == {"foreach"}
    with FakeTensorMode():
        # A count's fake CPU tensors stand for the device's (CUDA: foreach), unless they are the host's (L2L).
        assert kinds(LayerwiseOptimizer(layers(), run)) == {"foreach"}
        assert kinds(LayerwiseOptimizer(layers(), run, host=True)) == {"fused"}
    with pytest.raises(ValueError, match="impl='fast' is not one of"):
        LayerwiseOptimizer(layers(), run, impl="fast")


def test_fused_adamw_state_is_made_at_build():
    # torch's fused AdamW keeps its step count on the parameter's device; made at build as it would be lazily.
    run = RunConfig(optimizer="adamw").validate()
    named = [("w", torch.nn.Parameter(torch.ones(4)))]
    named[0][1].grad = torch.ones(4)
    opt = LayerwiseOptimizer([named], run)
    assert opt.opts[0].param_groups[0]["fused"]
    step = opt.opts[0].state[named[0][1]]["step"]
    assert (step.dtype, step.device.type, step.dim()) == (torch.float32, "cpu", 0)
    before = [t.data_ptr() for t in opt.state_tensors()]
    opt.step(0)
    assert [t.data_ptr() for t in opt.state_tensors()] == before and step.item() == 1.0


@pytest.mark.slow  # make test-slow: a whole native build (27 s); the default run loads the shared one
def test_two_checkouts_of_one_source_share_one_build(tmp_path, monkeypatch):
    """The kernel is built from a copy named by the source's digest, so a clone beside a working tree builds nothing
    again (torch's build and ninja's rule name the source's path); an edited source is a new build."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    built = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append((kw["name"], kw["sources"])) or object())
    for checkout in ("a", "b", "c"):
        src = tmp_path / checkout / "lamb.cpp"
        src.parent.mkdir()
        src.write_text("// kernel\n" + ("// edited\n" if checkout == "c" else ""))
        monkeypatch.setattr(fused_lamb, "SOURCES", src.parent)
        fused_lamb.compiled.cache_clear()
        try:
            assert fused_lamb.kernel() is not None
        finally:
            fused_lamb.compiled.cache_clear()
    (a, b, c) = built
    assert a == b and c[0] != a[0] and c[1] != a[1]
    assert a[1][0].startswith(str(tmp_path / "ext" / "memtrain-sources")) and Path(a[1][0]).read_text() == "// kernel\n"
