"""GPT-2 and BERT-MLM through the layered view: split invariance, L2L and 2BW equivalence, masks, HF parity."""

import dataclasses

import pytest
import torch

from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check, relative_error
from suite.harness.data import synthetic_batch, synthetic_batches
from suite.harness.masking import MASK_ID, mask_tokens
from suite.harness.model import build_model, plain_copy

FAMILIES = ("gpt2", "bert-mlm")


def _grads_after_one_step(run):
    method = build_method(run, torch.device("cpu"))
    method.opt.step = lambda step: None  # keep the first step's gradients, skip the update
    method.step(next(synthetic_batches(run, padded=True)))
    return {n: p.grad.detach().clone() for named in method.layer_params for n, p in named}, method


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("m", [2, 4])
def test_micro_batches_equal_one_big_batch(family, m):
    """First-step gradients of m micro-batches match one batch of 8 (dropout on) to 1e-5 per tensor."""
    big = RunConfig(model=ModelConfig(family=family), micro_batch_size=8, num_micro_batches=1).validate()
    g_big, method = _grads_after_one_step(big)
    g_split, _ = _grads_after_one_step(dataclasses.replace(big, micro_batch_size=8 // m, num_micro_batches=m))
    assert method.model.cfg.dropout > 0 and method.model.cfg.attention_dropout > 0
    free = method.model.gradient_free()
    errors = {k: relative_error(g_split[k], g_big[k]) for k in g_big if k not in free}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, (worst, errors[worst])


@pytest.mark.parametrize("family", FAMILIES)
def test_l2l_equals_grad_accum(family):
    res = check(RunConfig(method="l2l", model=ModelConfig(family=family), steps=3), "grad_accum", 3)
    assert res.passed, res.report(top=5)


@pytest.mark.parametrize("family", FAMILIES)
def test_pipedream_2bw_equals_reference(family):
    run = RunConfig(
        method="pipedream-2bw", model=ModelConfig(family=family), options={"executor": "reference", "stages": 2}
    )
    res = check(run, "2bw-reference", 4)
    assert res.passed, res.report(top=5)


@pytest.mark.parametrize("family", FAMILIES)
def test_layered_view_matches_hugging_face(family):
    """Dropout off, padded batch: the layered logits equal the stock model's at every real token."""
    model = build_model(ModelConfig(family=family), 1).eval()
    batch = synthetic_batch(0, 4, 16, 1024, 2, 1, padded=True, objective="clm" if family == "gpt2" else "mlm")
    ctx = model.begin(batch, 1, 0, batch.size)
    with torch.no_grad():
        model.forward_micro_batch(ctx)
        kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        if family == "bert-mlm":
            kwargs["token_type_ids"] = batch.token_type_ids
        theirs = plain_copy(model).eval()(**kwargs).logits
    real = batch.attention_mask.bool()
    assert torch.allclose(ctx.logits[real], theirs[real], atol=1e-5)


def test_gpt2_loss_is_hugging_face_loss_without_padding():
    model = build_model(ModelConfig(family="gpt2"), 1).eval()
    batch = synthetic_batch(0, 4, 16, 1024, 2, 1, objective="clm")
    with torch.no_grad():
        ours = model.forward_micro_batch(model.begin(batch, 1, 0, batch.size))
        theirs = plain_copy(model).eval()(input_ids=batch.input_ids, labels=batch.labels).loss
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_gpt2_is_causal():
    """Changing a later token leaves the logits of earlier positions unchanged, dropout on."""
    model = build_model(ModelConfig(family="gpt2"), 1)
    a = synthetic_batch(0, 2, 12, 1024, 2, 1, objective="clm")
    b = dataclasses.replace(a, input_ids=a.input_ids.clone())
    b.input_ids[:, 8:] = 7
    logits = []
    for batch in (a, b):
        ctx = model.begin(batch, 1, 0, batch.size)
        model.forward_micro_batch(ctx)
        logits.append(ctx.logits)
    assert torch.equal(logits[0][:, :8], logits[1][:, :8])
    assert not torch.equal(logits[0][:, 8:], logits[1][:, 8:])


def test_embeddings_and_heads_are_untied():
    for family, pair in (
        ("gpt2", ("transformer.wte.weight", "lm_head.weight")),
        ("bert-mlm", ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight")),
    ):
        params = dict(build_model(ModelConfig(family=family), 1).hf.named_parameters())
        assert params[pair[0]] is not params[pair[1]]


def test_mlm_mask_is_a_function_of_seed_step_and_sample():
    ids = torch.randint(5, 1024, (8, 64), generator=torch.Generator().manual_seed(0))
    full, labels = mask_tokens(ids, None, seed=3, step=2, vocab_size=1024)
    part, part_labels = mask_tokens(ids[4:], None, seed=3, step=2, vocab_size=1024, offset=4)
    assert torch.equal(full[4:], part) and torch.equal(labels[4:], part_labels)  # any split, same mask
    again = mask_tokens(ids, None, seed=3, step=2, vocab_size=1024)
    assert torch.equal(again[0], full) and torch.equal(again[1], labels)
    other = mask_tokens(ids, None, seed=3, step=3, vocab_size=1024)[1]
    assert not torch.equal(other, labels)
    targets = labels != -100
    assert 0.10 < targets.float().mean() < 0.20
    assert torch.equal(labels[targets], ids[targets])
    assert (full[targets] == MASK_ID).float().mean() > 0.6


def test_mlm_labels_identical_across_micro_batch_splits():
    batch = synthetic_batch(5, 8, 32, 1024, 2, 1, padded=True, objective="mlm")
    assert ((batch.labels != -100).sum(1) >= 1).all()  # every sample has a target
    assert ((batch.labels != -100) <= batch.attention_mask.bool()).all()  # never on padding
    for m in (2, 4):
        parts = batch.split(m)
        assert torch.equal(torch.cat([p.labels for p in parts]), batch.labels)
        assert torch.equal(torch.cat([p.input_ids for p in parts]), batch.input_ids)
