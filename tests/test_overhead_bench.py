"""Benchmark (skipped by default): a grad_accum forward/backward through the layered view vs plain Hugging Face."""

import pytest
import torch

from experiments.benchmarks.overhead import PROFILES, make_steps
from suite.config.run import RunConfig, apply_overrides


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
