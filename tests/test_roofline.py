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


def test_the_step_counts_its_non_matmul_kernels_its_heads_recompute_and_every_download():
    """Issue 63, item 6: the kernels that are not matmuls at the device memory's rate, the chunked LM head's logits
    made again, and the embeddings' gradient download after the backward, in series."""
    run = _run("l2l-cmp", options=L2L)
    spec = roofline.Machine("t", "H100", 1.0, 1.0, 1e3, 1e3, 1e3, 1.0)  # a slow device memory: its kernels show
    out = roofline.project(run, spec)
    tokens = run.batch_size * run.seq_len
    sums = roofline.sum_bytes(run, out.parameters, True)
    assert sums == (4 * 10 + 6) * out.parameters  # 4 micro-batches into an FP32 sum, rounded once
    assert out.elementwise_s == pytest.approx((tokens * roofline.elementwise_bytes(run, 4) + sums) / 1e9)
    assert out.compute_s > out.elementwise_s > 0
    import dataclasses

    chunked_run = dataclasses.replace(run, model=ModelConfig(preset="llama-tiny", layers=4, loss_chunk=8))
    assert roofline.head_recompute_flops(run) == 0 and roofline.head_recompute_flops(chunked_run) > 0
    chunked = roofline.project(chunked_run, spec)
    extra = run.batch_size * roofline.head_recompute_flops(chunked_run) / 1e12  # at the GEMM rate, 1 TFLOPS
    more = tokens * (roofline.elementwise_bytes(chunked_run, 4) - roofline.elementwise_bytes(run, 4)) / 1e9
    assert chunked.compute_s == pytest.approx(out.compute_s + extra + more)
    sizes = roofline.layer_sizes(run)
    fast = roofline.Machine("t", "H100", 1e3, 1e3, 1.0, 2.0, 1e3, 1e3, host_update_ns=0.0)
    tail = roofline.project(run, fast).tail_s
    assert tail == pytest.approx(sizes[0] * 2 / 2e9 + sizes[0] * 2 / 1e9)  # its gradient down, its weights up


def test_the_host_update_takes_its_measured_rate_and_names_the_rate_that_keeps_up():
    """The host's update a parameter at the machine's rate (a lent host's bench-link measures it); the rate at
    which the host would take exactly the compute's time is given beside, the bound a host must beat."""
    run = _run("l2l-cmp", options=L2L)
    slow = roofline.Machine("t", "H100", 1e-3, 1e-3, 1e3, 1e3, 1e3, 1e3, host_update_ns=50.0)
    out = roofline.project(run, slow)
    copies = out.pcie_bytes / 1e12
    assert out.host_s == pytest.approx(out.parameters * 50e-9 + copies)
    keeps_up = roofline.Machine("t", "H100", 1e-3, 1e-3, 1e3, 1e3, 1e3, 1e3, host_update_ns=out.host_ns_for_compute)
    even = roofline.project(run, keeps_up)
    assert even.host_s == pytest.approx(even.compute_s)
    assert roofline.project(_run("amp"), slow).host_ns_for_compute is None


def test_no_projection_on_the_roofline_page_is_above_what_its_terms_allow():
    """Each committed decoder-8b-roofline row's step is at least each resource's time it names (issue 63)."""
    from pathlib import Path

    from suite.records.index import Index

    index = Index(Path(__file__).resolve().parent.parent / "results")
    rows = [r["metrics"] for r in index.records() if r["experiment"] == "decoder-8b-roofline" and r["status"] == "ok"]
    assert rows
    for m in rows:
        assert m["step_time"] >= max(m["compute_s"], m["h2d_s"], m["d2h_s"], m["host_s"]) * (1 - 1e-9), m
        assert m["step_time"] >= m.get("elementwise_s", 0.0)


def test_a_gated_step_overlaps_its_commits_with_the_next_forward_only():
    """Issue 63, item 6: clipped (its norm taken on the device) or fp16 (its overflow gate), no layer commits before
    the backward ends, so the host's work overlaps only the next forward: a host slower than the forward lengthens
    the step by what it takes past it, where an ungated step hides it under the whole compute."""
    host_busy = roofline.Machine("t", "H100", 1.0, 1.0, 1e3, 1e3, 1e3, 1e3, host_update_ns=0.0)
    free = roofline.project(_run("l2l-cmp", options=L2L), host_busy)
    ns = 0.6 * free.compute_s / free.parameters * 1e9  # the host takes 60% of the compute's time
    spec = roofline.Machine("t", "H100", 1.0, 1.0, 1e3, 1e3, 1e3, 1e3, host_update_ns=ns)
    ungated = roofline.project(_run("l2l-cmp", options=L2L), spec)
    assert ungated.bound == "compute"
    for gated_run in (_run("l2l-cmp", options=L2L, clip_grad_norm=1.0), _run("l2l-cmp", "fp16", options=L2L)):
        gated = roofline.project(gated_run, spec)
        forward = gated.compute_s / 4  # recompute: a forward, a forward again and a backward of two
        assert gated.bound == "host"
        assert gated.step_s == pytest.approx(gated.compute_s - forward + gated.host_s + gated.tail_s)
        assert gated.host_ns_for_compute == pytest.approx((forward - gated.pcie_bytes / 1e12) / gated.parameters * 1e9)


def test_the_update_on_the_device_streams_its_state_over_the_link_and_leaves_the_host_its_copies():
    """Issue 63, item 3: priced beside the host's update, L2L's update on the device brings each layer's master and
    moments up (12 bytes a parameter) and takes them back with the 16-bit copy (14), its gradient never leaving;
    the host does no update, only the copies' traffic. A slow host update bounds the one, not the other."""
    run = _run("l2l-cmp", options={**L2L, "block_slots": 4})
    spec = roofline.Machine("t", "H100", 1.0, 1.0, 1e3, 1e3, 1e3, 1e3, host_update_ns=1e4)
    host, device = roofline.project(run, spec), roofline.project(run, spec, update="device")
    n = host.parameters
    assert (host.h2d_bytes, host.d2h_bytes) == (2 * n, 2 * n)
    assert (device.h2d_bytes, device.d2h_bytes) == (2 * n + 12 * n, 14 * n)
    assert device.host_s == pytest.approx(device.pcie_bytes / 1e12) and device.host_ns_for_compute is None
    assert host.bound == "host" and device.bound == "compute" and device.step_s < host.step_s
    with pytest.raises(ValueError, match="update='device'"):
        roofline.project(_run("amp"), spec, update="device")


def test_a_lent_hosts_measured_update_replaces_the_assumed_one(tmp_path):
    """The H200's stage-1 micro-benchmarks (results/campaign/h200-140gb/bench.json), converted into a bench-host-optim
    record of that machine, give the H200's host update a parameter (the suite's fused AdamW over a layer at its 16
    threads) in the catalogue's place, naming the record; the H100 keeps its assumption; a bench-link record that
    measures L2L's own update comes first."""
    from pathlib import Path

    from experiments import decoder_8b_roofline as unit
    from experiments.benchmarks import campaign_bench
    from suite.records import store
    from suite.records.index import Index

    campaign = Path(__file__).resolve().parent.parent / "results" / "campaign" / "h200-140gb"
    campaign_bench.convert(campaign / "bench.json", campaign / "environment.json", tmp_path)
    spec = unit.rates("h200", Index(tmp_path))
    assert spec.host_update_ns == pytest.approx(1.504, abs=1e-3)
    assert spec.sources["update"].startswith("measured: bench-host-optim on h200-140gb, 2026-11-27")
    assert spec.host_gbps == roofline.MACHINES["h200"].host_gbps  # the triad was not measured there
    assert unit.rates("h100", Index(tmp_path)) == roofline.MACHINES["h100"]
    figures = dict(h2d_gbps=53.0, d2h_gbps=51.0, host_ns_per_param=0.5)
    record = {
        "key": "k", "experiment": "bench-link", "row": "block", "method": "l2l-cmp", "profile": "paper",
        "device_type": "cuda", "variant": "", "config": {"run": {}}, "status": "ok", "metrics": figures,
        "provenance": {}, "finished": "2026-12-01T10:00:00", "machine": {"slug": "h200-140gb"},
    }  # fmt: skip
    store.save(tmp_path, "k", "h200-140gb", record)
    assert unit.rates("h200", Index(tmp_path)).host_update_ns == 0.5
