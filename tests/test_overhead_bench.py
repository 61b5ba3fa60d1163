"""The overhead benchmark: its cell through the runner at a tiny size; and (skipped by default) a grad_accum
forward/backward through the layered view against plain Hugging Face, as microbenchmarks."""

import pytest
import torch

from experiments.benchmarks.overhead import PROFILES, make_steps
from suite.config.run import RunConfig, apply_overrides
from suite.core.experiment import get_experiment
from suite.core.request import SweepRequest
from suite.records import store
from suite.sweep import sweep


def test_the_cell_runs_through_the_runner_and_renders(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    exp = get_experiment("bench-overhead")
    overrides = ["steps=2", "warmup=1", "seq_len=16"]
    (rec,) = sweep(
        SweepRequest(exp, "tiny", overrides=overrides, results_dir=tmp_path, wandb_mode="off"), progress=lambda m: None
    )
    m = rec["metrics"]
    assert rec["status"] == "ok" and m["repeats"] == 2 and m["layered_step_s"] > 0 and m["plain_step_s"] > 0
    assert m["layered_over_plain"] == pytest.approx(m["layered_step_s"] / m["plain_step_s"])
    assert store.run_path(tmp_path, rec["key"], "test-machine").exists() and rec["provenance"]["torch"]
    page = (tmp_path / "bench-overhead.md").read_text()
    assert "## tiny profile on test-machine (cpu device), set steps=2, set warmup=1, set seq_len=16" in page
    assert f"| {m['layered_step_s']:.4f} | {m['plain_step_s']:.4f} | {m['layered_over_plain']:.3f} |" in page


@pytest.fixture(scope="module")
def steps():
    run = apply_overrides(RunConfig(), PROFILES["tiny"]).validate()
    return make_steps(run, torch.device("cpu"))


def test_bench_layered_step(benchmark, steps):
    benchmark.group = "layered view vs plain HF"
    benchmark(steps[0])


def test_bench_plain_hf_step(benchmark, steps):
    benchmark.group = "layered view vs plain HF"
    benchmark(steps[1])
