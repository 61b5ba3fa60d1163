"""The pipeline benchmark: our pipelines and torch.distributed.pipelining's (peers) against grad_accum on 2 gloo ranks,
one cell through the runner (torchrun) at a tiny size; and (skipped by default) at its own shape, as a benchmark that
writes results/bench-pipeline.md, pytest-benchmark recording the launch and the speedups."""

import pytest

from experiments.benchmarks.pipeline_vs_torch import REFERENCE
from suite.commands.sweep import sweep
from suite.core.experiment import get_experiment
from suite.core.request import SweepRequest

TINY = [
    "model.hidden=32",
    "model.heads=2",
    "model.intermediate=64",
    "seq_len=16",
    "micro_batch_size=2",
    "num_micro_batches=4",
    "rounds=1",
    "steps=1",
    "pipelines=gpipe,pipedream-flush,torch-1f1b",
]


def check(rec: dict, m: int) -> None:
    """Every pipeline's first update equals grad_accum's (same model, split and keys); the reference comes first."""
    assert rec["status"] == "ok", rec.get("error")
    metrics = rec["metrics"]
    assert rec["provenance"]["torch"] and metrics["ideal_speedup"] == pytest.approx(2 * m / (m + 1))
    assert metrics["results"][0]["run"] == REFERENCE and "speedup_over_grad_accum" not in metrics["results"][0]
    for r in metrics["results"][1:]:
        assert r["max_update_rel_error_vs_grad_accum"] <= 1e-5, r["run"]


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_the_cell_runs_on_two_ranks_through_the_runner_and_renders(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    exp = get_experiment("bench-pipeline")
    (rec,) = sweep(
        SweepRequest(exp, "tiny", overrides=TINY, results_dir=tmp_path, wandb_mode="off"), progress=lambda m: None
    )
    check(rec, 4)
    assert [r["run"] for r in rec["metrics"]["results"]] == [REFERENCE, "gpipe", "pipedream-flush", "torch-1f1b"]
    assert rec["metrics"]["ranks"] == 2 and rec["metrics"]["threads_per_rank"] == 1
    page = (tmp_path / "bench-pipeline.md").read_text()
    assert "2 CPU gloo ranks, 1 thread each." in page and "| torch-1f1b | torch.distributed.pipelining |" in page
    assert f"| {REFERENCE} |  |" in page and "| 1 (reference) |  |" in page


def test_pipeline_step_time_vs_torch_pipelining(benchmark):
    exp = get_experiment("bench-pipeline")
    (rec,) = benchmark.pedantic(
        lambda: sweep(SweepRequest(exp, "tiny", force=True, wandb_mode="off")), rounds=1, iterations=1
    )
    check(rec, 8)
    for r in rec["metrics"]["results"][1:]:
        benchmark.extra_info[f"{r['run']} speedup over grad_accum"] = r["speedup_over_grad_accum"]
    benchmark.extra_info["ideal speedup"] = rec["metrics"]["ideal_speedup"]
