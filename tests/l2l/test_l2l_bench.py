"""Microbenchmarks (skipped by default): the host optimizer per parameter; one L2L step split by where time goes.

PYTHONPATH=. .venv/bin/python -m pytest tests/l2l/test_l2l_bench.py --benchmark-only -m "not slow"
PYTHONPATH=. .venv/bin/python -m pytest tests/l2l/test_l2l_bench.py --benchmark-only -m cuda   # on a GPU
"""

import time

import pytest
import torch

from methods.l2l.method import L2L
from methods.l2l.param_server import HostParamServer
from methods.l2l.timeline import breakdown, spans
from suite.config.run import ModelConfig, RunConfig
from suite.harness.data import synthetic_batches
from suite.harness.model import build_model

BLOCK = 1  # layer index of the encoder block in a one-block model


@pytest.fixture(scope="module")
def bert_base():
    """A one-block BERT-base: its block is the layer every host update below steps (7.1M parameters)."""
    return build_model(ModelConfig(preset="bert-base", layers=1), seed=0)


def _per_parameter(benchmark, params: int) -> None:
    benchmark.extra_info["parameters"] = params
    benchmark.extra_info["ns_per_parameter"] = benchmark.stats.stats.median * 1e9 / params


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_host_update_per_parameter(benchmark, bert_base, optimizer):
    run = RunConfig(optimizer=optimizer, weight_decay=0.01)
    server = HostParamServer(bert_base, run)
    for g in server.grads[BLOCK]:
        g.normal_()
    before = server.flat[BLOCK].clone()
    benchmark(server.opt.step_layer, BLOCK, 0)
    assert not torch.equal(before, server.flat[BLOCK])
    _per_parameter(benchmark, server.flat[BLOCK].numel())


def test_cmp_commit_per_parameter(benchmark, bert_base):
    """L2L-CMP's host commit of a landed bf16 gradient as the param server runs it applied as it lands: the one-pass
    kernel where it gives torch's bits here, else the windowed path (the record's extra_info says which)."""
    from suite.harness import host_commit

    run = RunConfig(method="l2l-cmp", precision="bf16", optimizer="adamw", weight_decay=0.01)
    server = HostParamServer(bert_base, run, torch.bfloat16, ring=1)
    landing = server.landing_for(BLOCK)
    landing.copy_(torch.randn(landing.shape))
    before = server.wire[BLOCK].clone()
    off = type("Off", (), {"enabled": False})()  # no loss scaling (bf16)
    benchmark(server.commit, BLOCK, 0, off)
    assert server.windowed and not torch.equal(before, server.wire[BLOCK])
    benchmark.extra_info["path"] = host_commit.status()
    _per_parameter(benchmark, server.flat[BLOCK].numel())


def test_torch_fused_cpu_adamw_per_parameter(benchmark, bert_base):
    params = [torch.nn.Parameter(p.detach().clone()) for p in bert_base.layers[BLOCK].parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    benchmark(opt.step)
    _per_parameter(benchmark, sum(p.numel() for p in params))


@pytest.mark.cuda
def test_l2l_step_breakdown_on_cuda(benchmark):
    run = RunConfig(
        method="l2l",
        device="cuda",
        model=ModelConfig(preset="bert-base"),
        seq_len=128,
        micro_batch_size=32,
        num_micro_batches=4,
        options={"stash": "cpu", "overlap": "on"},
    ).validate()
    device = torch.device("cuda")
    trace: list = []
    m = L2L(build_model(run.model, run.seed), run, device, trace=trace)
    batches = synthetic_batches(run)
    for _ in range(2):
        m.step(next(batches))
    torch.cuda.synchronize()
    parts = []

    def one_step():
        trace.clear()
        busy = m.server.busy_seconds
        base = torch.cuda.Event(enable_timing=True)
        base.record()
        t0 = time.perf_counter()
        m.step(next(batches))
        m.updater.drain()  # the host updates belong to the step
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        parts.append(breakdown(spans(trace, base), wall, (m.server.busy_seconds - busy) * 1e3))

    benchmark.pedantic(one_step, rounds=5, iterations=1)
    for key in parts[0]:
        benchmark.extra_info[key] = sorted(p[key] for p in parts)[len(parts) // 2]
    assert benchmark.extra_info["compute_ms"] > 0 and benchmark.extra_info["copy_ms"] > 0
