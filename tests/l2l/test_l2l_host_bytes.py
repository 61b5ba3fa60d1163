"""The param server's host bytes a parameter in each schedule of the host update (issue 54, item 2), and the
landing ring under a host slower than the device: no gradient is overwritten before its update has read it."""

import time

import pytest
import torch

from methods.l2l import param_server
from methods.l2l.param_server import WINDOW, HostParamServer
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.harness import host_commit
from suite.harness.loss_scale import DynamicLossScaler


def _run(method="l2l-cmp", precision="bf16", overlap="on", clip=0.0, layers=6, landing="ring", **kw) -> RunConfig:
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
        options={"overlap": overlap, "stash": "cpu", "landing": landing},
        **kw,
    ).validate()


@pytest.mark.parametrize(
    "method,precision,overlap,clip,per_param,ring",
    [
        # Applied as each gradient lands: the FP32 master, two moments and the 16-bit wire copy; no gradient a
        # parameter, only the ring (bounded by the largest layer) and AdamW's FP32 window.
        ("l2l-cmp", "bf16", "on", 0.0, 4 + 8 + 2, 3),
        # Clipped with its norm taken on the device, before anything ships: applied as it lands all the same.
        ("l2l-cmp", "bf16", "on", 0.05, 4 + 8 + 2, 3),
        # Held until the host may commit (after the whole backward, or behind fp16's overflow gate, or clipping's
        # norm taken on the host after the backward): a 16-bit landing a parameter besides.
        ("l2l-cmp", "bf16", "off", 0.0, 4 + 8 + 2 + 2, None),
        ("l2l-cmp", "fp16", "on", 0.0, 4 + 8 + 2 + 2, None),
        ("l2l-cmp", "bf16", "off", 0.05, 4 + 8 + 2 + 2, None),
        # FP32: the landing is the gradient the optimizer reads (no scratch, no wire copy).
        ("l2l", "fp32", "on", 0.0, 4 + 8, 3),
        ("l2l", "fp32", "off", 0.0, 4 + 4 + 8, None),
    ],
)
def test_host_bytes_a_parameter(method, precision, overlap, clip, per_param, ring):
    built = build_method(_run(method, precision, overlap, clip))
    server = built.server
    # the device holds every layer's gradient in its own dtype where it takes clipping's norm
    assert (built.held is not None) == (clip > 0 and ring is not None)
    if built.held is not None:
        assert built.held.nbytes() == sum(f.numel() for f in server.flat) * 2
    params = sum(f.numel() for f in server.flat)
    largest = max(f.numel() for f in server.flat)
    cmp = precision != "fp32"
    scratch = min(WINDOW, largest) if ring else largest
    bounded = (ring or 0) * largest * (2 if cmp else 4) + (scratch * 4 if cmp else 0)
    steps = 4 * sum(len(named) for named in server.named)  # AdamW's step count, a 0-d FP32 tensor a parameter tensor
    assert server.ring == ring
    assert server.nbytes() == per_param * params + bounded + steps


def _commit_steps(server, steps=3) -> list[torch.Tensor]:
    """Commit `steps` steps of the same bf16 gradients on every layer, head first; the host's state after."""
    gen = torch.Generator().manual_seed(0)
    off = DynamicLossScaler(enabled=False)
    for step in range(steps):
        for layer in reversed(range(server.num_layers)):
            land = server.landing_for(layer)
            land.copy_(torch.randn(land.shape, generator=gen))
            server.commit(layer, step, off)
    return [*server.flat, *server.wire, *server.optimizer_state()]


@pytest.mark.parametrize("threads", [1, 2])
def test_the_one_pass_commit_gives_the_whole_layers_bits(threads):
    """Applied as it lands, a layer's 16-bit gradient is read, stepped and its 16-bit copy written in one pass
    (csrc/adamw_cmp.cpp, each tensor's tail through torch's kernel): masters, 16-bit copies and moments equal, bit
    for bit, those of torch's fused AdamW over the whole layer's widened gradient (a held landing), at any number of
    threads. Some of the layers' tensors have tails (torch computes them apart; so does the commit)."""
    if host_commit.kernel() is None:
        pytest.skip(f"no one-pass commit here: {host_commit.status()}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        held = _commit_steps(build_method(_run(layers=2, landing="held")).server)
        server = build_method(_run(layers=2)).server
        assert server.windowed and server.threads == threads
        assert any(p.numel() % host_commit.UNIT for named in server.named for _, p in named)
        got = _commit_steps(server)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(got, held))


def test_the_probe_tells_a_kernel_off_by_one_bit():
    """The check the one-pass kernel passes before its first use fails a kernel whose masters differ by one bit."""
    module = host_commit.fused_lamb.compiled()
    if module is None:
        pytest.skip("native kernels unavailable")
    assert host_commit.probe(module)

    class OffByOne:
        def adamw_cmp_step(self, params, *args):
            module.adamw_cmp_step(params, *args)
            params[0].view(torch.int32)[5] += 1

    assert not host_commit.probe(OffByOne())


def test_adamw_applied_a_window_at_a_time_gives_the_whole_layers_bits(monkeypatch):
    """Where the one-pass kernel is not used, a 16-bit gradient applied as it lands is widened a window at a time
    (no FP32 gradient as large as a layer): masters, 16-bit copies and moments equal, bit for bit, those of the
    whole layer's update (a held landing). With windows of two alignment units, the embeddings and some blocks'
    matrices are cut. A window that starts off the alignment gives other bits (torch's fused AdamW computes a
    tensor's tail apart): the check can tell."""
    monkeypatch.setattr(host_commit, "kernel", lambda: None)
    held = _commit_steps(build_method(_run(layers=2, landing="held")).server)
    for size, same in ((2 * param_server.WINDOW_ALIGN, True), (param_server.WINDOW_ALIGN + 3, False)):
        monkeypatch.setattr(param_server, "WINDOW", size)
        server = build_method(_run(layers=2)).server
        assert server.windowed and server.scratch.numel() == size
        assert any(len(w[2]) > 1 for w in server._windows[1]) and len(server._windows[0]) > 2
        got = _commit_steps(server)
        assert all(torch.equal(a, b) for a, b in zip(got, held)) == same


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


def test_an_unregister_that_fails_says_so_by_its_code(monkeypatch):
    """cudaHostUnregister returns its error as a code, which no `except` catches: a failure is said (once a code),
    success and the runtime's unloading at exit are not (issue 63, item 7)."""
    import warnings

    from methods.l2l import lanes

    codes = iter([0, 4, 1, 1])
    monkeypatch.setattr(torch.cuda, "cudart", lambda: type("R", (), {"cudaHostUnregister": lambda _, p: next(codes)})())
    monkeypatch.setattr(lanes, "_said", set())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for _ in range(4):
            lanes._unregister(1234)
    assert [str(w.message) for w in said] == ["cudaHostUnregister of a pinned host buffer failed with cudaError 1"]
