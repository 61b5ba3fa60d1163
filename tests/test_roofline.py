"""The roofline of a decoder step (methods/roofline.py, issue 54 item 6): what each method moves and computes, and
which resource it names the limit."""

import pytest

from methods import roofline
from suite.config.run import ModelConfig, RunConfig


def _run(method, precision="bf16", options=None, micro_batches=4, layers=4, **kw) -> RunConfig:
    return RunConfig(
        method=method,
        precision=precision,
        model=ModelConfig(preset="llama-tiny", layers=layers),
        seq_len=64,
        micro_batch_size=1,
        num_micro_batches=micro_batches,
        optimizer="adamw",
        options=options or {},
        **kw,
    ).validate()


L2L = {"overlap": "on", "stash": "gpu"}
# A slow device beside a fast link and host: compute-bound
SLOW = roofline.Machine("test", "NVIDIA H100 80GB HBM3", 1e-6, 1e-6, 1.0, 1.0, 10.0, 100.0)


def test_l2l_uploads_each_layer_once_and_again_below_its_slots():
    """Two slots: the forward uploads every layer, the backward again every block below the top two; with a slot a
    block, once a step. Gradients come down once, at the wire's bytes; a stash on the host crosses both ways."""
    sizes = roofline.layer_sizes(_run("l2l-cmp", options=L2L))
    n, block = sum(sizes), sizes[1]
    two = roofline.project(_run("l2l-cmp", options=L2L), SLOW, sizes)
    every = roofline.project(_run("l2l-cmp", options={**L2L, "block_slots": 4}), SLOW, sizes)
    assert every.pcie_bytes == 2 * n * 2 and two.pcie_bytes == every.pcie_bytes + 2 * block * 2
    assert two.h2d_s > every.h2d_s and two.d2h_s == every.d2h_s == n * 2 / 1e9
    fp32 = roofline.project(_run("l2l", "fp32", options={**L2L, "block_slots": 4}), SLOW, sizes)
    assert fp32.pcie_bytes == 2 * every.pcie_bytes
    stashed = roofline.project(_run("l2l-cmp", options={**L2L, "stash": "cpu"}), SLOW, sizes)
    hidden = ModelConfig(preset="llama-tiny").resolved().hidden
    assert stashed.pcie_bytes == two.pcie_bytes + 2 * 4 * 64 * hidden * 2 * 4  # 4 blocks' inputs of 4 samples


def test_the_limit_is_the_busiest_resource_and_the_step_at_least_it():
    """On a fast link and host the device's compute bounds L2L-CMP; on a slow link, its uploads; FSDP2's offload
    gathers the FP32 shards at every micro-batch's forward and backward; AMP moves nothing over PCIe."""
    run = _run("l2l-cmp", options=L2L)
    fast = roofline.project(run, roofline.Machine("t", "H100", 1.0, 1.0, 1e3, 1e3, 1e3, 1e3))
    assert fast.bound == "compute" and fast.step_s == pytest.approx(fast.compute_s + fast.tail_s)
    slow = roofline.project(run, roofline.Machine("t", "H100", 1e3, 1e3, 1e-3, 1e3, 1e3, 1e3))
    assert slow.bound == "upload" and slow.step_s == pytest.approx(slow.h2d_s + slow.tail_s)
    n = slow.parameters
    fsdp = roofline.project(_run("fsdp-offload", options={"recompute": "on"}), SLOW)
    assert fsdp.pcie_bytes == 2 * 4 * n * 4 + n * 4
    # its optimizer runs after the backward: in series, never the limit of what overlaps
    host_bound = roofline.project(_run("fsdp-offload"), roofline.Machine("t", "H100", 1e3, 1e3, 1e3, 1e3, 1e-3, 1e3))
    overlapped = max(host_bound.compute_s, host_bound.h2d_s, host_bound.d2h_s)
    assert host_bound.bound != "host" and host_bound.step_s == pytest.approx(overlapped + host_bound.tail_s)
    assert host_bound.host_s > host_bound.step_s / 2  # the host is busiest, in series after what overlaps
    amp = roofline.project(_run("amp", options={"recompute": "on"}), SLOW)
    assert amp.pcie_bytes == 0 and amp.host_s == 0 and amp.bound == "compute"
    with pytest.raises(ValueError, match="no roofline for method 'gpipe'"):
        roofline.project(_run("gpipe", ranks=2), SLOW)


def test_the_roofline_table_projects_every_row_that_fits():
    """decoder-8b-roofline: each decoder-8b row but AMP at full depth (counted past the device), on each machine,
    held to that GPU's record of the row."""
    from experiments import decoder_8b, decoder_8b_roofline

    rows = decoder_8b_roofline.rows("paper")
    fits = [r.name for r in decoder_8b.rows("paper") if r.name not in ("8b-amp", "7b-amp")]
    assert [r.name for r in rows] == [f"{m}-{name}" for m in roofline.MACHINES for name in fits]
    assert all(r.projection["reference"]["row"] == r.name.split("-", 1)[1] for r in rows)


def test_a_lent_gpus_measured_rates_replace_the_assumed_ones(tmp_path):
    """Once a GPU of a kind has a bench-link record, the index gives that kind with its matmul, attention, PCIe and
    host rates in the catalogue's place, each naming the record, and the roofline takes them; the assumptions stand
    where none has, and for another kind."""
    from experiments import decoder_8b_roofline as unit
    from suite.records import store
    from suite.records.index import Index

    assert unit.rates("h100", Index(tmp_path)) == roofline.MACHINES["h100"]
    figures = dict(gemm_tflops=650.0, attention_tflops=420.0, h2d_gbps=53.0, d2h_gbps=51.0, triad_gbps=88.0)
    record = {
        "key": "k", "experiment": "bench-link", "row": "block", "method": "l2l-cmp", "profile": "paper",
        "device_type": "cuda", "variant": "", "config": {"run": {}}, "status": "ok", "metrics": figures,
        "provenance": {}, "finished": "2026-12-01T10:00:00", "machine": {"slug": "h100-79gb"},
    }  # fmt: skip
    store.save(tmp_path, "k", "h100-79gb", record)
    spec = unit.rates("h100", Index(tmp_path))
    assert (spec.gemm_tflops, spec.attention_tflops, spec.h2d_gbps, spec.d2h_gbps, spec.host_gbps) == (
        650.0, 420.0, 53.0, 51.0, 88.0
    )  # fmt: skip
    assert spec.sources["link"].startswith("measured: bench-link on h100-79gb, 2026-12-01")
    assert spec.device_gbps == roofline.MACHINES["h100"].device_gbps  # not measured: still assumed
    assert unit.rates("h200", Index(tmp_path)) == roofline.MACHINES["h200"]  # another kind's record: not its


@pytest.mark.parametrize("options", [L2L, {**L2L, "block_slots": 4}, {**L2L, "stash": "cpu"}])
def test_l2l_copies_each_step_the_bytes_its_roofline_counts(options):
    """What the relay copies in a step (its own tally, in its timeline) is what the roofline says L2L moves: every
    layer up and the blocks below its slots again, every gradient down, the stashed inputs both ways."""
    from suite.core.check import build_method
    from suite.harness.data import synthetic_batches

    run = _run("l2l-cmp", options=options)
    method, batches = build_method(run), synthetic_batches(run)
    for _ in range(2):  # the second step's tally is its own
        method.step(next(batches))
    timeline = method.timeline()
    counted = roofline.project(run, SLOW)
    assert (timeline["h2d_bytes"], timeline["d2h_bytes"]) == (counted.h2d_bytes, counted.d2h_bytes)
