"""The machine catalogue: each kind once, and every table of peaks and rates reads it."""

from experiments import l2l_projection
from methods import roofline
from methods.l2l import projection
from suite.measure import flops, machines


def test_a_device_and_a_slug_name_their_kind():
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA GH200 480GB", "Tesla V100-SXM2-16GB"]
    assert [machines.of_device(n).name for n in names] == ["h100", "h100-pcie", "h200", "gh200", "v100"]
    assert machines.of_device("AMD EPYC") is None
    assert machines.of_slug("h200-140gb").name == "h200" and machines.of_slug("cpu-epyc-2c") is None
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == machines.kind("h100").peaks["bf16"]
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == machines.kind("h100").peaks["tf32"]


def test_every_figure_says_where_it_comes_from():
    for kind in machines.KINDS.values():
        assert kind.peaks and kind.device_gb > 0
        for name, figure in kind.rates.items():
            assert figure.source.split(":")[0] in ("assumed", "measured", "datasheet"), (kind.name, name)


def test_the_roofline_and_the_projection_read_the_catalogue():
    for name in machines.LENT:
        kind, spec = machines.kind(name), roofline.MACHINES[name]
        assert (spec.h2d_gbps, spec.host_gbps, spec.device_gbps, spec.gemm_tflops) == (
            kind.rate("h2d_gbps"), kind.rate("host_gbps"), kind.rate("device_gbps"), kind.rate("gemm_tflops")
        )  # fmt: skip
        assert roofline.SLUGS[name] == l2l_projection.LENT[name] == kind.slug
    for name, device in projection.DEVICES.items():
        assert device.h2d_gbps == machines.kind(name).rate("h2d_gbps")
        assert device.sources["link"] == machines.kind(name).rates["h2d_gbps"].source
