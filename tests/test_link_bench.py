"""bench-link (experiments/benchmarks/link.py): the rates a decoder step's roofline stands on, measured."""

import pytest
import torch

from experiments.benchmarks import link
from suite.core.experiment import get_experiment


def _cell(device: str) -> tuple[dict, object]:
    (cell,) = get_experiment("bench-link").cells("tiny", None, [f"device={device}"], None)
    return link.link_cell(cell.run, torch.device(device), None), cell.run.model.resolved()


def test_on_a_cpu_the_host_figures_are_measured_and_pcie_is_not():
    """Every rate positive and each median inside its rounds' min..max; no PCIe without CUDA."""
    m, model = _cell("cpu")
    for key in ("gemm_tflops", "attention_tflops", "triad_gbps"):
        assert 0 < m[f"{key}_min"] <= m[key] <= m[f"{key}_max"]
    assert 0 < m["host_ns_min"] <= m["host_ns_per_param"] <= m["host_ns_max"]
    assert "h2d_gbps" not in m and m["block_params"] == sum(o * n for o, n in link.block_shapes(model))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_each_direction_of_pcie_and_both_at_once_are_measured():
    m, _ = _cell("cuda")
    for key in ("h2d_gbps", "d2h_gbps", "both_gbps", "gemm_tflops"):
        assert 0 < m[f"{key}_min"] <= m[key] <= m[f"{key}_max"]
    assert m["gpu"] == torch.cuda.get_device_name()
