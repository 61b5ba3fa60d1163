"""The param server's host bytes a parameter in each schedule of the host update (issue 54, item 2), and the
landing ring under a host slower than the device: no gradient is overwritten before its update has read it."""

import time

import pytest
import torch

from methods.l2l.param_server import HostParamServer
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check


def _run(method="l2l-cmp", precision="bf16", overlap="on", clip=0.0, layers=6, **kw) -> RunConfig:
    return RunConfig(
        method=method,
        precision=precision,
        device="cpu",
        model=ModelConfig(layers=layers),
        seq_len=16,
        micro_batch_size=2,
        num_micro_batches=2,
        optimizer="adamw",
        clip_grad_norm=clip,
        options={"overlap": overlap, "stash": "cpu"},
        **kw,
    ).validate()


@pytest.mark.parametrize(
    "method,precision,overlap,clip,per_param,ring",
    [
        # Applied as each gradient lands: the FP32 master, two moments and the 16-bit wire copy; no gradient a
        # parameter, only the ring and one FP32 scratch, each bounded by the largest layer.
        ("l2l-cmp", "bf16", "on", 0.0, 4 + 8 + 2, 3),
        # Held until the host may commit (after the whole backward, or behind fp16's overflow or clipping's norm
        # gate): a 16-bit landing a parameter besides.
        ("l2l-cmp", "bf16", "off", 0.0, 4 + 8 + 2 + 2, None),
        ("l2l-cmp", "fp16", "on", 0.0, 4 + 8 + 2 + 2, None),
        ("l2l-cmp", "bf16", "on", 0.05, 4 + 8 + 2 + 2, None),
        # FP32: the landing is the gradient the optimizer reads (no scratch, no wire copy).
        ("l2l", "fp32", "on", 0.0, 4 + 8, 3),
        ("l2l", "fp32", "off", 0.0, 4 + 4 + 8, None),
    ],
)
def test_host_bytes_a_parameter(method, precision, overlap, clip, per_param, ring):
    server = build_method(_run(method, precision, overlap, clip)).server
    params = sum(f.numel() for f in server.flat)
    largest = max(f.numel() for f in server.flat)
    cmp = precision != "fp32"
    bounded = (ring or 0) * largest * (2 if cmp else 4) + (largest * 4 if cmp else 0)
    steps = 4 * sum(len(named) for named in server.named)  # AdamW's step count, a 0-d FP32 tensor a parameter tensor
    assert server.ring == ring
    assert server.nbytes() == per_param * params + bounded + steps


def test_a_host_slower_than_the_device_never_loses_a_landed_gradient(monkeypatch):
    """A layer's gradient lands in the ring buffer of the layer three above it, once that layer's update is done. With
    the host's reading of each landing delayed, every layer's update still reads its own gradient: the result is
    AMP's. Without the wait the device side overwrites landings the host has not read (the check fails)."""
    prepare = HostParamServer.prepare

    def slow(self, layer, shipment, scaler, clip):
        time.sleep(0.02)
        return prepare(self, layer, shipment, scaler, clip)

    monkeypatch.setattr(HostParamServer, "prepare", slow)
    run = _run(layers=8)
    assert build_method(run).server.ring == 3
    result = check(run, "amp", steps=2)
    assert result.passed, result.report(top=5)


def test_a_pinned_host_buffer_is_registered_at_its_own_size(monkeypatch):
    """torch's pin_memory=True rounds a block up to a power of two (Llama 3 8B's 1.05 GB embeddings would take 2 GiB);
    a pinned host buffer registers its own pages instead: within a page of its size, sharing a page with no other
    registration (CUDA refuses a second one), zeroed where asked."""
    from methods.l2l import lanes

    calls = []
    monkeypatch.setattr(lanes, "_register", lambda buf, ptr, size: calls.append((ptr, size)))
    for numel, dtype in ((1, torch.bfloat16), (1000, torch.float32), (3 * lanes.PAGE + 5, torch.float16)):
        buf = lanes.host_buffer(numel, dtype, pin=True, zero=True)
        ptr, size = calls[-1]
        assert buf.numel() == numel and buf.dtype == dtype and not buf.any()
        assert ptr == buf.data_ptr() and ptr % lanes.PAGE == 0 and size % lanes.PAGE == 0
        assert buf.nbytes <= size < buf.nbytes + lanes.PAGE
    assert lanes.host_buffer(10, torch.float32, pin=False).numel() == 10 and len(calls) == 3


def test_a_gated_commit_unscales_by_the_scale_of_its_own_backward():
    """Behind fp16's gate a layer's FP32 gradient is made in the scratch when it is prepared and made again at its
    commit (other layers used the scratch between), and the commits run after the step has updated the loss scale:
    each must be unscaled by the scale its backward ran with, not the grown one."""

    class Landed:
        def host_wait(self):
            pass

    m = build_method(_run(precision="fp16", layers=2))
    server, scaler = m.server, m.scaler
    assert server.ring is None and scaler.enabled
    for i in range(server.num_layers):
        server.landing_for(i).copy_(torch.linspace(-0.5, 0.5, server.flat[i].numel()) * scaler.scale)
    made = scaler.scale
    for i in range(server.num_layers):
        server.prepare(i, Landed(), scaler, False)
    scaler.scale *= 2  # the step's update, before its commits run
    seen = {}
    server.opt.step_layer = lambda layer, step: seen.setdefault(layer, [g.clone() for g in server.grads[layer]])
    for i in range(server.num_layers):
        server.commit(i, 0, scaler)
        want = server.landing_for(i).float() / made
        assert torch.equal(torch.cat([g.reshape(-1) for g in seen[i]]), want), i
