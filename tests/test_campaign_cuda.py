"""What the GPU campaign's stage 1 proves beyond the other cuda tests: FP32 equivalence with TF32 off, pinned
asynchronous copies, and a capped cell that runs out of memory recorded as `oom` by the runner."""

import pytest
import torch

from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.core.experiment import get_experiment
from suite.core.launcher import run_cell
from suite.harness.data import synthetic_batches

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture
def tf32_off():
    """TF32 off for matmuls and cuDNN (an Ampere+ GPU would otherwise round FP32 inputs to 10 mantissa bits)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize(
    "method,options",
    [
        ("l2l", {"stash": "cpu", "overlap": "on"}),
        ("gpipe", {"stages": 2}),
        ("pipedream-flush", {"stages": 2}),
    ],
)
def test_fp32_equivalence_with_tf32_off(tf32_off, method, options):
    run = RunConfig(
        method=method,
        device="cuda",
        model=ModelConfig(layers=4),
        seq_len=32,
        micro_batch_size=2,
        num_micro_batches=4,
        options=options,
    )
    assert not torch.backends.cuda.matmul.allow_tf32
    result = check(run, "grad_accum", steps=3)
    assert result.passed, result.report(top=5)


@pytest.mark.parametrize("method", ["l2l", "l2l-cmp"])
def test_every_buffer_that_crosses_the_bus_is_pinned(method):
    run = RunConfig(
        method=method,
        device="cuda",
        precision="fp32" if method == "l2l" else "fp16",
        model=ModelConfig(layers=4),
        seq_len=32,
        micro_batch_size=2,
        num_micro_batches=2,
        options={"stash": "cpu"},
    ).validate()
    m = build_method(run)
    batches = synthetic_batches(run)
    m.step(next(batches))
    torch.cuda.synchronize()
    moving = list(m.server.wire) + list(m.server.landing) + list(m.stash.host.values())
    assert m.stash.host, "stash=cpu kept nothing on the host"
    assert moving and all(t.is_pinned() for t in moving)


def test_capped_cell_out_of_memory_is_recorded_as_oom():
    exp = get_experiment("table2")
    (cell,) = exp.cells("tiny", ["baseline-fp32"], ["device=cuda", "model.preset=bert-base", "seq_len=128"], "64MiB")
    record = run_cell(cell, timeout=300)
    assert record["status"] == "oom", record.get("error", "")[-2000:]


def test_the_worker_measures_what_fresh_processes_measure_on_cuda(tmp_path, monkeypatch):
    """Isolation on the GPU: fp32, fp16 and bf16 cells of two shapes and L2L-CMP, in one worker and each in a fresh
    process, two interleaved rounds each way: the same paths and final losses, each cell's rate within 5% and its
    peak within 2% of the fresh processes' (the worker's rows of 2026-11-26 ran 6x slower after a fallback)."""
    from test_runner import make_experiment

    from suite.commands.sweep import sweep
    from suite.core.experiment import Row
    from suite.core.request import SweepRequest
    from suite.core.worker_client import close_shared_worker

    monkeypatch.setenv("SUITE_MACHINE", "cuda-isolation")
    # 20 timed steps a round: at 5 the H200's rounds of one cell in one worker differed by 10% (launch-bound tiny
    # steps of a few ms), which would fail a 5% bound by chance (2026-11-27, c9bdb98).
    shape = {"model.layers": 4, "model.heads": 4, "seq_len": 128, "micro_batch_size": 16, "warmup": 3, "steps": 20}
    wide = {"model.hidden": 512, "model.intermediate": 2048}
    narrow = {"model.hidden": 256, "model.intermediate": 1024}
    rows = [
        Row("fp32", "grad_accum", {**shape, **narrow}),
        Row("fp16", "amp", {**shape, **narrow, "precision": "fp16"}),
        Row("bf16", "amp", {**shape, **narrow, "precision": "bf16"}),
        Row("fp16-wide", "amp", {**shape, **wide, "precision": "fp16"}),
        Row("cmp", "l2l-cmp", {**shape, **narrow, "precision": "fp16"}),
    ]
    exp = make_experiment(rows)
    runs = {}
    try:
        for worker in (False, True):
            req = SweepRequest(
                exp, "tiny", results_dir=tmp_path / str(worker), wandb_mode="off", worker=worker, rounds=2,
                overrides=("device=cuda",),
            )  # fmt: skip
            runs[worker] = sweep(req, progress=print)
    finally:
        close_shared_worker()
    for f, w in zip(runs[False], runs[True]):
        assert f["status"] == w["status"] == "ok", (f["row"], f.get("error"), w.get("error"))
        assert f["provenance"]["harness"] == w["provenance"]["harness"], f["row"]
        assert f["metrics"]["final_loss"] == w["metrics"]["final_loss"], f["row"]
        rate = w["metrics"]["throughput"] / f["metrics"]["throughput"]
        peak = w["metrics"]["memory_gb"] / f["metrics"]["memory_gb"]
        assert 0.95 <= rate <= 1.05, f"{f['row']}: the worker's rate is {rate:.3f}x the fresh processes'"
        assert 0.98 <= peak <= 1.02, f"{f['row']}: the worker's peak is {peak:.3f}x the fresh processes'"
