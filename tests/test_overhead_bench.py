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


@pytest.mark.slow  # make test-slow: about 20 s; make bench-overhead runs the same cell
def test_the_cell_runs_through_the_runner_and_renders(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    exp = get_experiment("bench-overhead")
    overrides = ["steps=2", "warmup=1", "seq_len=16", "rounds=3"]
    req = SweepRequest(exp, "tiny", overrides=overrides, results_dir=tmp_path, wandb_mode="off")
    rec, *steps = sweep(req, progress=lambda m: None)
    m = rec["metrics"]
    assert rec["status"] == "ok" and m["repeats"] == 2 and m["layered_step_s"] > 0 and m["plain_step_s"] > 0
    assert m["layered_over_plain"] == pytest.approx(m["layered_step_s"] / m["plain_step_s"])
    assert store.run_path(tmp_path, rec["key"], "test-machine").exists() and rec["provenance"]["torch"]
    page = (tmp_path / "bench-overhead.md").read_text()
    assert "## tiny profile on test-machine (cpu device), set steps=2, set warmup=1, set seq_len=16" in page
    assert f"| {m['layered_step_s']:.4f} | {m['plain_step_s']:.4f} | {m['layered_over_plain']:.3f} | — | — |" in page
    # The whole steps, grad_accum in FP32 and amp in bf16 (on a CPU), against the plain loop in interleaved rounds
    assert [(r["row"], r["config"]["run"]["precision"]) for r in steps] == [
        ("grad_accum-vs-hf", "fp32"),
        ("amp-vs-hf", "bf16"),
    ]
    for r in steps:
        s = r["metrics"]
        assert r["status"] == "ok" and s["rounds"] == 3 and len(s["ratio_rounds"]) == 3
        assert s["ratio_min"] <= s["layered_over_plain"] <= s["ratio_max"]
        assert s["layered_over_plain"] == pytest.approx(sorted(s["ratio_rounds"])[1])
        assert f"| {s['ratio_min']:.3f} | {s['ratio_max']:.3f} |" in page


def test_the_plain_loop_trains_the_same_model_as_grad_accum_without_dropout():
    """The comparison is fair: with dropout off (the one thing the two draw differently), two steps of the plain loop
    move the weights as two of the suite's grad_accum do, its one optimizer matching the per-layer ones."""
    from experiments.benchmarks.overhead import plain_loop
    from suite.config.run import ModelConfig
    from suite.core.check import build_method, relative_error
    from suite.harness.data import synthetic_batches

    run = RunConfig(model=ModelConfig(dropout=0.0, attention_dropout=0.0), micro_batch_size=2, num_micro_batches=2)
    method = build_method(run.validate(), torch.device("cpu"))
    plain = plain_loop(method.model, run, torch.device("cpu"))
    batches = synthetic_batches(run, padded=True)
    for _ in range(2):
        batch = next(batches)
        assert method.step(batch).loss == pytest.approx(plain(batch), rel=1e-5)
    ours = dict(method.model.hf.named_parameters())
    for name, p in plain.model.named_parameters():
        if name not in method.model.gradient_free():
            assert relative_error(p.detach(), ours[name].detach()) < 1e-5, name


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
