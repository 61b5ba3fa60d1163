"""CUDA behaviour of the harness (run with `make test-cuda` on a GPU machine)."""

import dataclasses

import pytest
import torch

from suite.config.run import RunConfig
from suite.core.check import build_method, check, relative_error
from suite.harness.data import synthetic_batches
from suite.measure.memory import apply_device_memory_cap
from suite.measure.step import measure

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_ag_on_cuda_matches_cpu_without_dropout():
    """Same weights, batches and math on both devices (dropout off: CPU and CUDA draw different bits)."""
    run = RunConfig(
        micro_batch_size=2,
        num_micro_batches=4,
        model=dataclasses.replace(RunConfig().model, dropout=0.0, attention_dropout=0.0),
    ).validate()
    finals = []
    for dev in ("cpu", "cuda"):
        method = build_method(dataclasses.replace(run, device=dev))
        batches = synthetic_batches(run, padded=True)
        for _ in range(2):
            method.step(next(batches))
        finals.append(method.state_dict())
    free = method.model.gradient_free()
    worst = max(relative_error(finals[1][k], finals[0][k]) for k in finals[0] if k not in free)
    assert worst < 1e-4


def test_split_equals_big_batch_on_cuda_with_dropout():
    run = RunConfig(device="cuda", micro_batch_size=2, num_micro_batches=4)
    assert check(run, "grad_accum", steps=2).passed


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_amp_on_cuda_within_16bit_tolerance(precision):
    result = check(
        RunConfig(method="amp", device="cuda", precision=precision, micro_batch_size=2, num_micro_batches=4),
        "grad_accum",
        steps=3,
    )
    assert result.passed, result.report(top=5)


def test_measure_reports_cuda_peaks_and_the_cap_causes_oom():
    run = RunConfig(device="cuda", micro_batch_size=2, num_micro_batches=2, steps=2, warmup=1).validate()
    device = torch.device("cuda")
    method = build_method(run, device)
    m = measure(method, synthetic_batches(run), 1, 2, device).summary()
    assert m["memory_kind"].startswith("cuda") and m["device_peak_reserved"] >= m["device_peak_allocated"] > 0
    apply_device_memory_cap("64MiB", device)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
