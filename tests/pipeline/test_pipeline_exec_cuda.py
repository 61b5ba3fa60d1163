"""CUDA: the reference executor on one GPU and the dist executor on NCCL ranks (run with -m cuda on a GPU machine)."""

import re

import pytest
import torch

from methods.pipeline.executors.torchrun import torchrun
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import check

pytestmark = pytest.mark.cuda
MODEL = ModelConfig(layers=2, hidden=32, heads=2, intermediate=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method,recompute", [("gpipe", True), ("pipedream-flush", False)])
def test_reference_executor_on_one_gpu(method, recompute):
    run = RunConfig(
        method=method,
        model=MODEL,
        seq_len=8,
        micro_batch_size=4,
        num_micro_batches=4,
        device="cuda",
        options={"executor": "reference", "stages": 3, "recompute": recompute},
    )
    result = check(run, "grad_accum", steps=3)
    assert result.passed, result.report(top=5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("method,stages,width", [("gpipe", 2, 1), ("pipedream-flush", 2, 1), ("pipedream-flush", 2, 2)])
def test_dist_executor_on_nccl(method, stages, width):
    if torch.cuda.device_count() < stages * width:
        pytest.skip(f"needs {stages * width} CUDA devices")
    args = [
        "--method",
        method,
        "--steps",
        "3",
        "--set",
        "model.layers=2",
        "--set",
        "model.hidden=32",
        "--set",
        "model.heads=2",
        "--set",
        "model.intermediate=64",
        "--set",
        "seq_len=8",
        "--set",
        f"num_micro_batches={4 * width}",
        "--set",
        f"stages={stages}",
        "--set",
        f"width={width}",
    ]
    proc = torchrun(stages * width, "methods.pipeline.executors.dist_check", args, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert re.search(r"PASS: largest", proc.stdout) and "): equal" in proc.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_planner_profiles_layers_on_the_gpu():
    """The per-layer profile on CUDA: allocator counters for bytes, synchronized timings, NCCL-style sends."""
    from methods.pipeline.planner.profiling import measure_profile

    run = RunConfig(model=MODEL, seq_len=16).validate()
    prof = measure_profile(run, micro_batch_sizes=(1, 2), repeats=2, device=torch.device("cuda"))
    blocks = prof.layers[1:-1]
    assert len(blocks) == 2 and all(c.keep_bytes > c.out_bytes > 0 for c in blocks)
    assert blocks[0].out_bytes == pytest.approx(16 * 32 * 4)
    assert not prof.holds_sends and "measured: " in prof.source and "cpu" not in prof.source
