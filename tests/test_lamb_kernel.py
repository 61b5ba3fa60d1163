"""The device's multi-tensor LAMB (suite/harness/kernels/lamb_step.py) as LayerwiseOptimizer uses it, run here by
Triton's interpreter on CPU tensors (conftest.py sets TRITON_INTERPRET=1 without CUDA); on CUDA through
tests/test_cuda_kernels.py. The kernel against torch's foreach LAMB at its edges: tests/test_device_lamb.py."""

import copy

import pytest
import torch

pytest.importorskip("triton")

from suite.config.run import RunConfig  # noqa: E402
from suite.harness.optim import Lamb, LayerwiseOptimizer  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def _params(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = [torch.nn.Parameter(torch.randn(s, generator=gen).to(DEVICE)) for s in shapes]
    out[-1].data.zero_()  # a weight whose norm is 0: its trust ratio is 1
    return out


SHAPES = [(3000,), (17, 33), (2048,), (5,), (4100,), (7, 9)]


def test_a_layerwise_optimizer_steps_every_layer_in_one_pass(kernel_here, monkeypatch):
    """LayerwiseOptimizer.step on the device: all layers' groups in one call of the kernel, the same weights as
    stepping each layer's foreach LAMB."""
    from suite.harness.kernels import lamb_step

    run = RunConfig(optimizer="lamb", lr=1e-2, weight_decay=0.01)
    layers = [
        [(f"l{i}.weight", p), (f"l{i}.bias", q)]
        for i, (p, q) in enumerate(zip(_params(SHAPES[:3]), _params(SHAPES[3:], 2)))
    ]
    twin = copy.deepcopy(layers)
    calls = []
    real = lamb_step.step
    monkeypatch.setattr(lamb_step, "step", lambda *a: calls.append(len(a[1])) or real(*a))
    dev = LayerwiseOptimizer(layers, run, impl="fused")
    ref = LayerwiseOptimizer(twin, run, impl="foreach")
    gen = torch.Generator().manual_seed(3)
    for step in range(2):
        for (_, p), (_, q) in zip((x for lay in layers for x in lay), (x for lay in twin for x in lay)):
            p.grad = torch.randn(p.shape, generator=gen).to(DEVICE)
            q.grad = p.grad.clone()
        dev.step(step)
        ref.step(step)
    assert calls == [6, 6]  # one call a step, every tensor of every layer in it
    for (_, p), (_, q) in zip((x for lay in layers for x in lay), (x for lay in twin for x in lay)):
        torch.testing.assert_close(p.data, q.data, rtol=2e-6, atol=2e-7)


def test_the_cpus_lamb_keeps_its_own_kernels_without_the_tests_switch():
    """On a CPU run the device kernel is never taken (the host's fused kernel or foreach, as before)."""
    params = [torch.nn.Parameter(torch.randn(10)) for _ in range(2)]
    opt = Lamb([dict(params=params)], device_fused=True)
    assert not opt._on_device_kernel([*params])
