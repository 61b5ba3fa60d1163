"""The count against the GPU it stands in for: a cell counted on fake tensors and the same cell measured by CUDA's
allocator (max_memory_allocated over warm-up and timed steps) agree within 5% (#12). Run by the GPU campaign."""

import dataclasses

import pytest
import torch

from suite.core.experiment import get_experiment
from suite.core.launcher import run_cell

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPE = ["device=cuda", "model.preset=bert-base", "seq_len=256", "model.layers=8", "warmup=1", "steps=1"]


@pytest.mark.parametrize(
    "row,extra",
    [
        ("baseline-fp32", ["micro_batch_size=4", "num_micro_batches=2"]),
        ("baseline-amp", ["micro_batch_size=4", "num_micro_batches=2", "precision=fp16"]),
        ("l2l-fp32", ["micro_batch_size=8"]),
        ("l2l-cmp", ["micro_batch_size=8", "stash=cpu", "precision=fp16"]),
    ],
)
def test_counted_device_peak_within_5_percent_of_cuda_max_memory_allocated(row, extra):
    (cell,) = get_experiment("table2").cells("tiny", [row], SHAPE + extra)
    measured = run_cell(dataclasses.replace(cell, kind="throughput"), timeout=600)
    counted = run_cell(dataclasses.replace(cell, kind="count"), timeout=600)
    assert measured["status"] == counted["status"] == "ok", (measured.get("error"), counted.get("error"))
    real, mine = measured["metrics"]["device_peak_allocated"], counted["metrics"]["device_peak_allocated"]
    assert mine == pytest.approx(real, rel=0.05), (row, mine, real)
