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
        assert roofline.SLUGS[name] == kind.slug and l2l_projection.LENT[name].startswith(kind.slug)
    for name, device in projection.DEVICES.items():
        assert device.h2d_gbps == machines.kind(name).rate("h2d_gbps")
        assert device.sources["link"] == machines.kind(name).rates["h2d_gbps"].source


def test_an_h100_nvl_is_not_the_sxm_kind():
    """A slug names the kind whose slug starts it longest: an NVL's records are not the SXM's (its rates, its peaks)."""
    assert machines.of_slug("h100-nvl-94gb").name == "h100-nvl" and machines.of_slug("h100-79gb").name == "h100"


def test_the_projections_rows_are_the_cells_of_their_committed_records():
    """A projection's definition and its committed records agree on each cell's key: a key that moves without the
    records made again leaves every row 'not run' at the next sweep (a catalogue slug in a row's options did once)."""
    from pathlib import Path

    from suite.core.experiment import get_experiment
    from suite.records.index import Index

    index = Index(Path(__file__).resolve().parent.parent / "results")
    for name in ("l2l-projection", "decoder-8b-roofline"):
        committed = [r for r in index.records() if r["experiment"] == name and r["profile"] == "paper"]
        moved = []
        for device in {r["config"]["run"]["device"] for r in committed}:  # the device the projections ran on
            cells = {c.row.name: c.key for c in get_experiment(name).cells("paper", overrides=[f"device={device}"])}
            mine = [r for r in committed if r["config"]["run"]["device"] == device]
            moved += sorted(r["row"] for r in mine if r["row"] in cells and cells[r["row"]] != r["key"])
        assert committed and moved == [], f"{name}: keys moved for {moved} (make {name.split('-roofline')[0]})"
