"""The device's multi-tensor LAMB (suite/harness/kernels/lamb_step.py) at its edges: empty and zero tensors, a layer
stepped alone, the optimizers' state layout, a counted step, a failing launch. Run by Triton's interpreter on CPU
tensors (conftest.py sets TRITON_INTERPRET=1 without CUDA); the cuda-marked test compiles it on a GPU.
LayerwiseOptimizer's use of it (every layer in one call) is here too."""

import copy

import pytest
import torch

pytest.importorskip("triton")

from suite.config.run import RunConfig  # noqa: E402
from suite.harness.kernels import KernelError  # noqa: E402
from suite.harness.optim import Lamb, LayerwiseOptimizer  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    # The interpreter evaluates both sides of tl.where: ||w|| / ||u|| of a zero tensor is 0/0 before it is replaced.
    pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning"),
]

# Empty tensors, sizes that end mid-chunk (the kernel's chunk is 2048 elements), one exactly a chunk.
SHAPES = [(0,), (2049,), (5, 0), (17, 33), (2048,), (3,), (4100,), (1,)]
ZERO = 5  # the index of a weight that starts at 0 and whose gradient is 0: both norms 0, its trust ratio 1


def _params(device, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in shapes]
    if shapes is SHAPES:
        out[ZERO].data.zero_()
    return out


def _grads(params, gen):
    for i, p in enumerate(params):
        p.grad = torch.zeros_like(p) if i == ZERO else torch.randn(p.shape, generator=gen).to(p.device)


def _compare(device, steps=3):
    """The same weights and gradients through Lamb's foreach path and the device kernel, both weight-decay groups."""
    runs = []
    for device_fused in (False, True):
        params = _params(device)
        half = len(params) // 2
        groups = [dict(params=params[:half], weight_decay=0.01), dict(params=params[half:], weight_decay=0.0)]
        opt = Lamb(groups, lr=1e-2, device_fused=device_fused)
        gen = torch.Generator().manual_seed(1)
        for _ in range(steps):
            _grads(params, gen)
            opt.step()
        runs.append((params, opt))
    (ref, ref_opt), (dev, dev_opt) = runs
    assert dev_opt.__dict__.get("_layouts"), "the device kernel did not run"
    for r, d in zip(ref, dev):
        torch.testing.assert_close(d.data, r.data, rtol=2e-6, atol=2e-7)
        sr, sd = ref_opt.state[r], dev_opt.state[d]
        assert sd.keys() == sr.keys() == {"step", "exp_avg", "exp_avg_sq"} and sd["step"] == sr["step"] == steps
        torch.testing.assert_close(sd["exp_avg"], sr["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sd["exp_avg_sq"], sr["exp_avg_sq"], rtol=1e-5, atol=1e-9)
    assert not dev[ZERO].any()  # ||w|| = ||u|| = 0: trust 1, no NaN, the weight stays 0
    assert all(torch.isfinite(p).all() for p in dev)


def test_empty_and_zero_tensors_step_as_the_foreach_lamb(kernel_here):
    _compare("cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernel_steps_as_the_foreach_lamb_on_cuda():
    _compare("cuda")


def _layers(seed):
    """Two layers of a weight (decayed), a LayerNorm weight and a bias (not decayed), one of them empty."""
    weights, norms, biases = (
        _params("cpu", s, seed + k) for k, s in enumerate([[(40, 3), (9,)], [(70,), (3,)], [(0,), (5,)]])
    )
    return [
        [(f"l{i}.weight", p), (f"l{i}.LayerNorm.weight", q), (f"l{i}.bias", r)]
        for i, (p, q, r) in enumerate(zip(weights, norms, biases))
    ]


def _layerwise(monkeypatch, stepping: str, steps: int = 3):
    """LayerwiseOptimizer on the device kernel beside the per-layer foreach LAMB, the same weights and gradients,
    stepped by `stepping` ("step": every layer at once; "step_layer": one at a time): the tensors each kernel call
    took, the two models' weights (asserted equal), and the device side."""
    from suite.harness.kernels import lamb_step

    run = RunConfig(optimizer="lamb", lr=1e-2, weight_decay=0.01)
    layers = _layers(0)
    twin = copy.deepcopy(layers)
    calls = []
    real = lamb_step.step
    monkeypatch.setattr(lamb_step, "step", lambda *a: calls.append(len(a[1])) or real(*a))
    dev = LayerwiseOptimizer(layers, run, impl="fused")
    ref = LayerwiseOptimizer(twin, run, impl="foreach")
    state = dev.state_tensors()
    pairs = list(zip((x for lay in layers for x in lay), (x for lay in twin for x in lay)))
    gen = torch.Generator().manual_seed(3)
    for step in range(steps):
        for (_, p), (_, q) in pairs:
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        for opt in (dev, ref):
            if stepping == "step":
                opt.step(step)
            else:
                for i in range(len(layers)):
                    opt.step_layer(i, step)
    for (_, p), (_, q) in pairs:
        torch.testing.assert_close(p.data, q.data, rtol=2e-6, atol=2e-7)
    after = dev.state_tensors()
    assert len(after) == len(state) and all(a is b for a, b in zip(after, state))  # stepped in place
    for o in dev.opts:
        assert all(s.keys() == {"step", "exp_avg", "exp_avg_sq"} and s["step"] == steps for s in o.state.values())
    return calls


def test_a_layerwise_optimizer_steps_every_layer_in_one_pass(kernel_here, monkeypatch):
    """LayerwiseOptimizer.step on the device: all layers' groups in one call of the kernel."""
    assert _layerwise(monkeypatch, "step") == [6] * 3  # one call a step, every tensor of every layer in it


def test_step_layer_steps_one_layer_through_the_kernel(kernel_here, monkeypatch):
    """step_layer (pipeline stages, the planner's profile): that layer's tensors alone, in one call of the kernel;
    the optimizers' state is the preallocated one, unchanged in layout."""
    assert _layerwise(monkeypatch, "step_layer") == [3, 3] * 3  # one call per layer and step, both decay groups


def test_the_cpus_lamb_keeps_its_own_kernels_without_the_tests_switch():
    """On a CPU run the device kernel is never taken (the host's fused kernel or foreach, as before)."""
    params = [torch.nn.Parameter(torch.randn(10)) for _ in range(2)]
    opt = Lamb([dict(params=params)], device_fused=True)
    assert not opt._on_device_kernel([*params])


def test_a_counted_step_launches_nothing_and_counts_only_the_norm_buffers(kernel_here, monkeypatch):
    """Under FakeTensorMode the kernels are not launched; the step counts (its state's step advances) and the
    ledger sees only the small per-chunk and per-tensor buffers the kernel path allocates, not foreach's temporaries."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from suite.harness.kernels import lamb_step
    from suite.measure.counting import Ledger

    monkeypatch.setattr(lamb_step, "_moments", None)  # a launch would fail
    run = RunConfig(optimizer="lamb", lr=1e-2, weight_decay=0.01)
    with FakeTensorMode(allow_non_fake_inputs=True):
        layers = [[("w", torch.nn.Parameter(torch.randn(64, 1024))), ("b", torch.nn.Parameter(torch.randn(1024)))]]
        opt = LayerwiseOptimizer(layers, run)
        for _, p in layers[0]:
            p.grad = torch.randn(p.shape)
        ledger = Ledger("cpu")
        with ledger:
            opt.step(0)
    assert 0 < ledger.peak["device"] <= 2 * 512  # two buffers of a few bytes, each rounded to a 512 B block
    assert all(s["step"] == 1 for s in opt.opts[0].state.values())


def test_a_failing_launch_is_a_kernel_error(kernel_here, monkeypatch):
    from suite.harness.kernels import lamb_step

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no such kernel")

    monkeypatch.setattr(lamb_step, "_moments", Broken())
    params = _params("cpu", [(10,), (3,)])
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(KernelError, match="device_lamb"):
        Lamb([dict(params=params)], device_fused=True).step()
