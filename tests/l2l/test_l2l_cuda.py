"""L2L on a GPU (cuda marker): copies overlap compute, memory is flat in depth, and the equivalence holds on CUDA."""

import gc

import pytest
import torch

from methods.l2l.method import L2L
from methods.l2l.timeline import breakdown, overlap, spans, union
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.harness.data import synthetic_batches
from suite.harness.model import build_model


def test_timeline_arithmetic():
    # CPU-side check of the interval arithmetic the CUDA tests and the benchmark rely on.
    assert union([(0, 2), (1, 3), (5, 6)]) == 4
    assert overlap((0, 2), (1, 3)) == 1 and overlap((0, 1), (2, 3)) == 0
    parts = breakdown([("forward", 1, 0, 4), ("upload", 2, 1, 3), ("download", 1, 3, 6)], wall_ms=10, host_ms=2)
    assert parts["compute_ms"] == 4 and parts["copy_ms"] == 5 and parts["copy_hidden_ms"] == 3
    assert parts["device_idle_ms"] == 6


def _cuda_run(**kw) -> RunConfig:
    options = kw.pop("options", {})
    return RunConfig(method=kw.pop("method", "l2l"), device="cuda", options=options, **kw)


@pytest.mark.cuda
def test_upload_of_the_next_layer_overlaps_compute():
    run = _cuda_run(
        model=ModelConfig(preset="bert-base", layers=8), seq_len=128, micro_batch_size=16, num_micro_batches=4
    ).validate()
    trace: list = []
    m = L2L(build_model(run.model, run.seed), run, torch.device("cuda"), trace=trace)
    batches = synthetic_batches(run)
    m.step(next(batches))
    torch.cuda.synchronize()
    trace.clear()
    base = torch.cuda.Event(enable_timing=True)
    base.record()
    m.step(next(batches))
    torch.cuda.synchronize()
    forward, upload = {}, {}
    for kind, layer, a, b in spans(trace, base):
        if kind == "forward":
            forward[layer] = (a, b)
        elif kind == "upload" and layer not in upload:  # the forward's upload of the layer
            upload[layer] = (a, b)
    blocks = range(1, m.model.num_layers - 2)
    hidden = [layer for layer in blocks if overlap(upload[layer + 1], forward[layer]) > 0]
    assert len(hidden) == len(blocks), (hidden, forward, upload)


@pytest.mark.cuda
@pytest.mark.parametrize("options", [dict(stash="gpu", overlap="off"), dict(stash="cpu", overlap="on")])
def test_equivalence_on_cuda(options):
    run = _cuda_run(model=ModelConfig(layers=4), seq_len=32, micro_batch_size=2, num_micro_batches=4, options=options)
    result = check(run, "grad_accum", steps=3)
    assert result.passed, result.report(top=5)
    cmp = check(
        _cuda_run(
            method="l2l-cmp",
            precision="fp16",
            model=ModelConfig(layers=4),
            seq_len=32,
            micro_batch_size=2,
            num_micro_batches=4,
            options=options,
        ),
        "amp",
        steps=3,
    )
    assert cmp.passed, cmp.report(top=5)


@pytest.mark.cuda
def test_device_memory_flat_in_depth_on_cuda():
    # What the method adds on the device over what the process held before it was built. The first
    # depth is run twice and its first run dropped: the first matmuls on each stream allocate cuBLAS's
    # workspaces (68 MB on an H100), once per process, which would count against whichever depth ran first.
    peaks, block = [], 0
    for layers in (4, 4, 16):
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        run = _cuda_run(
            model=ModelConfig(preset="tiny-wide", layers=layers),
            seq_len=128,
            micro_batch_size=8,
            num_micro_batches=2,
            options={"stash": "cpu"},
        ).validate()
        m = build_method(run)
        batches = synthetic_batches(run)
        m.step(next(batches))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        m.step(next(batches))
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - before)
        block = sum(p.numel() * 4 for p in m.model.layers[1].parameters())
        del m
        torch.cuda.empty_cache()
    assert abs(peaks[2] - peaks[1]) < block, (peaks, block)
