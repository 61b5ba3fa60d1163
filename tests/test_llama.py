"""The Llama family: the layered view is Hugging Face's LlamaForCausalLM (rotary positions, grouped-query
attention, causal and padding mask), and every method and peer computes what grad_accum computes on it."""

import dataclasses
import importlib.util
import subprocess
import sys

import pytest
import torch

from methods.pipeline.executors.torchrun import torchrun
from suite.config.errors import ConfigError
from suite.config.paths import ROOT
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import check
from suite.harness.data import synthetic_batches
from suite.harness.model import build_model, plain_copy

LLAMA = ["device=cpu", "model.preset=llama-tiny", "seq_len=16"]
TIMEOUT = 400


def _run(method="grad_accum", precision="fp32", **kw) -> RunConfig:
    return RunConfig(
        method=method,
        precision=precision,
        device="cpu",
        model=ModelConfig(preset="llama-tiny"),
        seq_len=16,
        options=kw.pop("options", {}),
        **{"micro_batch_size": 2, "num_micro_batches": 4, **kw},
    )


def test_presets_have_the_published_shapes():
    shapes = {
        p: ModelConfig(preset=p).resolved() for p in ("llama-1b", "llama-3b", "llama-8b", "llama-70b", "llama-tiny")
    }
    assert all(m.family == "llama" and m.dropout == m.attention_dropout == 0.0 for m in shapes.values())
    assert [(m.layers, m.hidden, m.heads, m.kv_heads) for m in shapes.values()][:4] == [
        (16, 2048, 32, 8),
        (28, 3072, 24, 8),
        (32, 4096, 32, 8),
        (80, 8192, 64, 8),
    ]
    assert shapes["llama-tiny"].heads > shapes["llama-tiny"].kv_heads  # grouped queries, as the real ones
    with pytest.raises(ConfigError, match="is a llama model"):
        ModelConfig(preset="llama-1b", family="gpt2").resolved()
    with pytest.raises(ConfigError, match="kv_heads applies to model.family='llama' only"):
        ModelConfig(preset="tiny", kv_heads=2).resolved()


def test_parameter_counts_are_the_published_ones():
    # Built on the meta device (no memory): Llama 3.2 1B is 1.24B with tied embeddings, 1.50B untied; 8B is 8.03B.
    with torch.device("meta"):
        counts = {
            p: sum(t.numel() for t in build_model(ModelConfig(preset=p), 0).parameters())
            for p in ("llama-1b", "llama-8b")
        }
    assert counts["llama-1b"] == 1_498_482_688
    assert counts["llama-8b"] == 8_030_261_248


def test_the_layered_view_is_hugging_faces_model():
    run = _run(micro_batch_size=4, num_micro_batches=1)
    model = build_model(run.model, run.seed)
    mb = next(synthetic_batches(run, padded=True)).split(1)[0]
    assert mb.attention_mask is not None and not mb.attention_mask.all()
    ctx = model.begin(mb, run.seed, 0, mb.size)
    model.forward_micro_batch(ctx)
    plain = plain_copy(model)(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    real = mb.attention_mask.bool()
    assert torch.equal(ctx.logits[real], plain[real])
    assert model.hf.config.num_key_value_heads < model.hf.config.num_attention_heads


@pytest.mark.parametrize("kv_heads", [2, 4])  # grouped (2 for 4 query heads), and one each
def test_an_unpadded_batch_stays_causal_under_attention_dropout(kv_heads):
    """A batch with nothing padded has no mask (LlamaFamily.mask): in training with attention dropout (the keyed,
    materialised path here: FP32 on a CPU, grouped K/V repeated there) no position may see a later token. Changing
    only the last token leaves every earlier position's logits as they were (they moved by 0.21 when causality was
    lost), and the run is the layered view's own, not a stock model's."""
    run = RunConfig(
        device="cpu", model=ModelConfig(preset="llama-tiny", kv_heads=kv_heads, attention_dropout=0.2), seq_len=16,
        micro_batch_size=2, num_micro_batches=1,
    )  # fmt: skip
    model = build_model(run.model, run.seed).train()
    mb = dataclasses.replace(next(synthetic_batches(run, padded=False)).split(1)[0], attention_mask=None)
    assert model.family.mask(mb) is None  # nothing padded: no mask, as a loader without one gives it
    logits = []
    for last in (1, 2):
        mb.input_ids[:, -1] = last
        ctx = model.begin(mb, run.seed, 0, mb.size)
        with torch.no_grad():
            model.forward_micro_batch(ctx)
        logits.append(ctx.logits)
    assert torch.equal(logits[0][:, :-1], logits[1][:, :-1])
    assert not torch.equal(logits[0][:, -1], logits[1][:, -1])


@pytest.mark.parametrize(
    "method,precision,options,against,bitwise",
    [
        ("amp", "bf16", {}, "grad_accum", False),
        ("l2l", "fp32", {"stash": "cpu", "overlap": "on"}, "grad_accum", True),
        ("l2l", "fp32", {"stash": "gpu", "overlap": "off"}, "grad_accum", True),
        ("l2l-cmp", "bf16", {"stash": "cpu", "overlap": "on"}, "amp", False),
        ("l2l-cmp", "fp16", {"overlap": "on"}, "amp", False),
        ("gpipe", "fp32", {}, "grad_accum", True),
        ("pipedream-flush", "fp32", {"stages": 3}, "grad_accum", True),
        ("pipedream-2bw", "fp32", {}, "2bw-reference", True),
    ],
)
def test_every_method_matches_its_reference(method, precision, options, against, bitwise):
    result = check(_run(method, precision, options=options), against, steps=3)
    assert result.passed, result.report(top=5)
    if bitwise:
        assert result.worst[1] == 0.0, result.report(top=5)


def test_cmp_summing_16_micro_batches_stays_within_the_oracle_against_amp():
    """L2L-CMP's slots sum their bf16 gradients over the micro-batches in FP32, as AMP does (issue 63, item 5; the
    sum itself: tests/l2l/test_l2l_relay.py): at 16 micro-batches, Llama 3's 8B step, the update stays within the
    oracle's bound of AMP's at this width, and no worse than at 2 (a sum that drifted with its length would grow with
    it)."""
    errors = {}
    for u in (2, 16):
        run = _run(
            "l2l-cmp", "bf16", options={"stash": "cpu", "overlap": "on"}, micro_batch_size=1, num_micro_batches=u
        )
        result = check(run, "amp", steps=2)
        assert result.passed, result.report(top=5)
        errors[u] = result.worst[1]
    assert errors[16] <= 1.5 * errors[2], errors


def test_the_chunked_lm_loss_is_the_whole_heads_loss_and_gradients():
    """Llama 3's 128256-wide head at 4096 tokens makes 2.1 GB of FP32 logits a sequence (and their gradient): past
    256 MiB the loss is made 1024 tokens at a time, each chunk's logits made again in the backward. Forced here at
    tiny width (5 tokens a chunk, which divides nothing), padded samples and one with no target token included: the
    loss and every gradient are the whole head's, and no logits are kept."""
    from suite.harness.families.lm import LOSS_CHUNK, chunk_for

    assert chunk_for(4095, 128256, None) == LOSS_CHUNK and chunk_for(15, 256, None) == 0 and chunk_for(9, 9, 0) == 0
    run = _run(micro_batch_size=4, num_micro_batches=1)
    mb = next(synthetic_batches(run, padded=True)).split(1)[0]
    mb.labels[1, :] = -100  # a sample with nothing to predict counts 0
    got = {}
    for chunk in (0, 5):
        model = build_model(dataclasses.replace(run.model, loss_chunk=chunk), run.seed)
        head = model.layers[-1]
        width = model.hf.config.hidden_size
        hidden = torch.randn(mb.size, run.seq_len, width, generator=torch.Generator().manual_seed(0)).requires_grad_()
        loss, logits = head(hidden, mb.labels, mb.size)
        loss.backward()
        got[chunk] = (loss.detach(), hidden.grad, head.lm_head.weight.grad, head.norm.weight.grad, logits)
    (whole, *grads, logits), (chunked, *cgrads, none) = got[0], got[5]
    assert logits is not None and none is None
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-7)
    for ours, theirs in zip(cgrads, grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    with pytest.raises(ConfigError, match="loss_chunk"):
        ModelConfig(preset="tiny", loss_chunk=4).resolved()


@pytest.mark.parametrize(
    "method,precision,options,against",
    [("l2l-cmp", "bf16", {"stash": "cpu", "overlap": "on"}, "amp"), ("amp", "bf16", {}, "grad_accum")],
)
def test_a_chunked_head_trains_as_its_reference(method, precision, options, against):
    run = _run(method, precision, options=options)
    run = dataclasses.replace(run, model=dataclasses.replace(run.model, loss_chunk=5))
    result = check(run, against, steps=3)
    assert result.passed, result.report(top=5)


def _check_cli(method: str, *sets: str) -> subprocess.CompletedProcess:
    args = [x for s in [*LLAMA, *sets] for x in ("--set", s)]
    cmd = [sys.executable, "-m", "suite", "check", method, "--steps", "3", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT)


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_suite_check_takes_the_preset():
    proc = _check_cli("l2l-cmp", "precision=bf16", "num_micro_batches=4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS")


@pytest.mark.slow  # make test-slow: torchrun ranks
def test_peers_match_grad_accum_on_two_ranks():
    from methods.peers.torch_pipelining import gloo_mixes_p2p
    from suite.core import registry

    # torch's seven schedules (the V ones where gloo mixes p2p batches: not torch 2.11's), FSDP2 and both ZeROs (where
    # DeepSpeed is installed: an optional extra, not on the GPU image)
    schedules = [n for n in registry.names() if registry.get(n).peer == "torch.distributed.pipelining"]
    schedules = [n for n in schedules if gloo_mixes_p2p() or registry.get(n).placement != "v"]
    zero = ["deepspeed-offload", "deepspeed-infinity"] if importlib.util.find_spec("deepspeed") else []
    methods = ["fsdp-offload", *zero, *schedules]
    args = [x for m in methods for x in ("--method", m)] + ["--steps", "3"]
    sets = [*LLAMA, "num_micro_batches=4", "micro_batch_size=4", "optimizer=adamw"]
    args += [x for s in sets for x in ("--set", s)]
    proc = torchrun(2, "methods.peers.dist_check", args, TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert f"{len(methods)} of {len(methods)} passed" in proc.stdout, proc.stdout[-4000:]


@pytest.mark.slow  # make test-slow: torchrun ranks
@pytest.mark.parametrize("method", ["gpipe", "pipedream-flush", "pipedream-2bw"])
def test_our_pipelines_on_ranks_match_their_reference(method):
    proc = _check_cli(method, "executor=dist", "num_micro_batches=4")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS: largest 0.000e+00" in proc.stdout, proc.stdout[-3000:]  # bitwise, as the reference executor


def test_flops_are_six_per_matmul_parameter_and_token_plus_attention():
    from suite.measure import flops

    run = RunConfig(model=ModelConfig(preset="llama-8b"), seq_len=4096)
    m = run.model.resolved()
    h, kv, i, s = m.hidden, m.kv_heads * m.hidden // m.heads, m.intermediate, run.seq_len
    matmul_params = m.layers * (2 * h * (h + kv) + 3 * h * i) + h * m.vocab_size  # the LM head's too
    per_token = flops.per_sample(run)["flops_per_sample"] / s
    assert per_token == 6 * matmul_params + 12 * s * h * m.layers


def test_a_block_off_its_models_device_takes_a_copy_of_the_rotary_there_once():
    """A slot's block on a device the model's rotary is not on gets the rotary's frequencies there once, not a
    blocking copy from the host at every micro-batch (issue 63, item 7); on the rotary's own device, the rotary."""
    from suite.harness.families.llama import rotary_on
    from suite.harness.model import build_model

    model = build_model(ModelConfig(preset="llama-tiny"), 0)
    rotary = model.layers[1].rotary  # layers: the embeddings, the blocks, the head
    here = torch.zeros(1, 4, 8)
    assert rotary_on(rotary, here) is rotary
    there = torch.zeros(1, 4, 8, device="meta")  # a device the model is not on (a GPU's slot, on a GPU)
    copy = rotary_on(rotary, there)
    assert copy is not rotary and copy.inv_freq.device == there.device and rotary.inv_freq.device == here.device
    assert rotary_on(model.layers[2].rotary, there) is copy  # one copy a device, whichever block asks
    cos, sin = copy(there, torch.arange(4, device="meta")[None])
    assert cos.device == there.device and cos.shape == (1, 4, rotary.inv_freq.numel() * 2)
