"""The FLOPs formula against torch's own FLOP counter, and TFLOPS and MFU where a CUDA record carries them."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from suite.config.run import ModelConfig, RunConfig
from suite.core.rounds import merge
from suite.harness.data import synthetic_batch
from suite.harness.model import build_model
from suite.measure import flops


@pytest.mark.parametrize("recompute", ["off", "on"])
def test_the_formula_is_what_torch_counts_in_a_training_step(recompute):
    """Forward and backward of a tiny BERT (matmuls of every block, pooler, classifier) as torch's counter sees them."""
    run = RunConfig(micro_batch_size=4, num_micro_batches=1, seq_len=32, options={"recompute": recompute}).validate()
    model = build_model(ModelConfig(), seed=0)
    batch = synthetic_batch(0, 4, 32, 1024, 2, seed=0)
    with FlopCounterMode(display=False) as counter:
        ctx = model.begin(batch, seed=0, step=0, denom=4)
        model.forward_micro_batch(ctx, recompute=recompute == "on").backward()
    per = flops.per_sample(run)
    assert counter.get_total_flops() == pytest.approx(4 * per["hardware_flops_per_sample"], rel=1e-9)
    extra = per["hardware_flops_per_sample"] - per["flops_per_sample"]
    assert (extra > 0) == (recompute == "on")


def test_bert_large_at_512_tokens():
    """About 1.0 TFLOP per sample: 6 x 302M block parameters x 512 tokens, plus attention's 12 L S^2 H."""
    run = RunConfig(model=ModelConfig(preset="bert-large"), seq_len=512).validate()
    per = flops.per_sample(run)["flops_per_sample"]
    blocks = 24 * (4 * 1024**2 + 2 * 1024 * 4096)
    assert per == pytest.approx(6 * blocks * 512 + 12 * 24 * 512**2 * 1024, rel=1e-4)


def test_peaks_by_device_name_and_precision():
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "fp16") == 989.4
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9  # FP32 matmuls on CUDA cores
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == 494.7
    assert flops.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert flops.peak_tflops("NVIDIA H200", "bf16") == 989.4
    assert flops.peak_tflops("Some Future GPU", "fp16") is None


def test_merged_rounds_recompute_tflops_and_mfu_from_the_median_throughput():
    def outcome(rate):
        m = {"throughput": rate, "flops_per_sample": 1e12, "hardware_flops_per_sample": 1.5e12, "peak_tflops": 100.0}
        return {"status": "ok", "metrics": {**m, **flops.achieved(m)}, "provenance": None}

    merged = merge([outcome(10.0), outcome(30.0), outcome(20.0)], planned=3)["metrics"]
    assert merged["throughput"] == 20.0
    assert merged["model_tflops"] == pytest.approx(20.0)
    assert merged["mfu"] == pytest.approx(0.2)
    assert merged["hfu"] == pytest.approx(0.3)
    assert flops.achieved({"throughput": 5.0}) == {}  # a CPU record: nothing to add


def test_tokens_and_six_n_tflops_where_a_cell_stored_its_parameters():
    """Offloading papers (MegaTrain: 272 TFLOPS for Qwen2.5-7B on an H100) count 6 x parameters x tokens a second;
    a CUDA cell stores its parameters and tokens a sample, and merged rounds recompute both from the median."""
    m = {"throughput": 2.0, "flops_per_sample": 1e12, "hardware_flops_per_sample": 1e12}
    assert flops.achieved(m).keys() == {"model_tflops", "hardware_tflops"}
    got = flops.achieved({**m, "parameters": 8_030_261_248, "tokens_per_sample": 4096})
    assert got["tokens_per_s"] == 8192.0
    assert got["tflops_6n"] == pytest.approx(6 * 8_030_261_248 * 8192 / 1e12)
    run = RunConfig(model=ModelConfig(preset="llama2-7b"), seq_len=16)
    assert flops.parameters(run) == 6_738_415_616  # Llama 2 7B's published count


def test_a_section_shows_tflops_and_mfu_only_where_its_records_have_them():
    from suite.report import tables

    assert not tables.has_flops([None, {"metrics": {"throughput": 3.0}}])
    assert tables.has_flops([{"metrics": {"throughput": 3.0, "model_tflops": 1.0, "mfu": 0.1}}])
    from suite.core.experiment import get_experiment

    exp = get_experiment("table2")
    names = [c.name for c in tables.columns(exp, flops=True)]
    spread = next(i for i, n in enumerate(names) if n.endswith("spread"))
    assert names[spread + 1 : spread + 3] == ["TFLOPS", "MFU"]
    assert "TFLOPS" not in [c.name for c in tables.columns(exp)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_a_cuda_cell_records_its_flops():
    from suite.core.cell import throughput_cell

    run = RunConfig(device="cuda", micro_batch_size=2, num_micro_batches=2, warmup=1, steps=2).validate()
    m = throughput_cell(run, torch.device("cuda"), None)
    assert m["model_tflops"] > 0 and "peak_of" in m


def test_l2l_counts_its_recompute_in_hardware_flops_never_in_model_flops():
    """L2L's backward recomputes every block from its stash whatever its options (issue 51): its hardware FLOPs
    (HFU) count a fourth forward of the blocks; its model FLOPs (MFU) do not. AG recomputes only when asked."""
    from suite.core.registry import get

    run = RunConfig(method="l2l", model=ModelConfig(preset="bert-base"), seq_len=128)
    assert get("l2l").recomputes(run) and get("l2l-cmp").recomputes(run)
    assert not get("grad_accum").recomputes(run)
    assert get("grad_accum").recomputes(RunConfig(method="grad_accum", options={"recompute": "on"}))
    plain, l2l = flops.per_sample(run), flops.per_sample(run, recompute=get("l2l").recomputes(run))
    assert l2l["flops_per_sample"] == plain["flops_per_sample"] == plain["hardware_flops_per_sample"]
    m = run.model.resolved()
    block = flops.block_flops(run.seq_len, m.hidden, m.intermediate)
    assert l2l["hardware_flops_per_sample"] == plain["flops_per_sample"] + m.layers * block
