"""The count against the GPU it stands in for: a cell counted on fake tensors and the same cell measured by CUDA's
allocator (max_memory_allocated over warm-up and timed steps) agree within 5% (#12). Run by the GPU campaign: each
count (host cores only) runs beside its measured cell, so the device waits for neither."""

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from suite.commands.campaign.stages import counted_cells
from suite.core.launcher import run_cell

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("cell", counted_cells(), ids=lambda c: c.row.name)
def test_counted_device_peak_within_5_percent_of_cuda_max_memory_allocated(cell):
    with ThreadPoolExecutor(1) as pool:
        count = pool.submit(run_cell, dataclasses.replace(cell, kind="count"), 600)
        measured = run_cell(dataclasses.replace(cell, kind="throughput"), timeout=600)
        counted = count.result()
    assert measured["status"] == counted["status"] == "ok", (measured.get("error"), counted.get("error"))
    real, mine = measured["metrics"]["device_peak_allocated"], counted["metrics"]["device_peak_allocated"]
    assert mine == pytest.approx(real, rel=0.05), (cell.row.name, mine, real)
