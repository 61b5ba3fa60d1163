"""The layered view computes what the Hugging Face model computes, and builds the paper's presets."""

import pytest
import torch

from suite.config.errors import ConfigError
from suite.config.run import ModelConfig, RunConfig
from suite.harness.data import synthetic_batch
from suite.harness.model import build_model, plain_copy


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_layered_forward_matches_huggingface(padded, attn):
    model = build_model(ModelConfig(), seed=0)
    model.eval()
    plain = plain_copy(model, attn)
    batch = synthetic_batch(0, 4, 16, 1024, 2, seed=0, padded=padded)
    ctx = model.begin(batch, seed=0, step=0, denom=batch.size)
    loss = model.forward_micro_batch(ctx)
    with torch.no_grad():
        ref = plain(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
            labels=batch.labels,
        )
    torch.testing.assert_close(ctx.logits, ref.logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, ref.loss, rtol=1e-5, atol=1e-6)


def test_mean_pooling_reads_the_mean_of_the_unpadded_tokens():
    model = build_model(ModelConfig(pooling="mean"), seed=0)
    model.eval()
    batch = synthetic_batch(0, 4, 16, 1024, 2, seed=0, padded=True)
    assert not batch.attention_mask.all()  # some samples are padded
    ctx = model.begin(batch, seed=0, step=0, denom=batch.size)
    model.forward_micro_batch(ctx)
    plain = plain_copy(model, "sdpa")
    with torch.no_grad():
        hidden = plain.bert(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids
        ).last_hidden_state
        m = batch.attention_mask.float().unsqueeze(-1)
        mean = (hidden * m).sum(1) / m.sum(1)
        head = model.layers[-1]
        ref = head.classifier(head.pooler.activation(head.pooler.dense(mean)))
    torch.testing.assert_close(ctx.logits, ref, rtol=1e-5, atol=1e-6)
    cls = build_model(ModelConfig(), seed=0).eval()
    ctx_cls = cls.begin(batch, seed=0, step=0, denom=batch.size)
    cls.forward_micro_batch(ctx_cls)
    assert not torch.allclose(ctx_cls.logits, ctx.logits)  # same weights, another input to the pooler


def test_the_default_pooling_leaves_a_configs_key_as_it_was():
    """Records made before `model.pooling` existed keep matching their cells; "mean" is a new key."""
    assert "pooling" not in RunConfig().to_dict()["model"]
    assert RunConfig(model=ModelConfig(pooling="mean")).to_dict()["model"]["pooling"] == "mean"
    assert RunConfig.from_dict(RunConfig().to_dict()) == RunConfig()


def test_bert_large_preset_is_the_papers_table_1():
    cfg = ModelConfig(preset="bert-large").resolved()
    assert (cfg.layers, cfg.hidden, cfg.intermediate, cfg.heads, cfg.max_seq) == (24, 1024, 4096, 16, 512)


def test_depth_and_width_override_the_preset():
    model = build_model(ModelConfig(layers=3, hidden=32, heads=2, intermediate=64), seed=0)
    assert model.num_layers == 5  # embed + 3 blocks + head
    assert model.hf.config.hidden_size == 32


def test_layers_are_named_by_huggingface_names():
    model = build_model(ModelConfig(layers=2), seed=0)
    names = [n for i in range(model.num_layers) for n, _ in model.layer_named_parameters(i)]
    assert names == [n for n, _ in model.hf.named_parameters()]


def test_bad_model_config_errors_name_the_choices():
    with pytest.raises(ConfigError, match="bert-large"):
        ModelConfig(preset="bert-huge").resolved()
    with pytest.raises(ConfigError, match="multiple of"):
        ModelConfig(hidden=30, heads=4).resolved()
    with pytest.raises(ConfigError, match="max_seq"):
        RunConfig(seq_len=4096).validate()
    with pytest.raises(ConfigError, match=r"model.pooling='max' is not one of \['cls', 'mean'\]"):
        ModelConfig(pooling="max").resolved()
    with pytest.raises(ConfigError, match="family='bert' only"):
        ModelConfig(family="gpt2", pooling="mean").resolved()


@pytest.mark.parametrize(
    "preset,family", [("tiny", "bert"), ("tiny", "bert-mlm"), ("tiny", "gpt2"), ("llama-tiny", "llama")]
)
def test_hugging_faces_init_alone_draws_every_parameter(preset, family):
    """model.init=hf skips torch's default init (its parameters NaN until Hugging Face's init draws over them): every
    parameter is then drawn, from the same distributions as the full init (each tensor's spread within a tenth), in
    other bits, and the same bits from the same seed. The default leaves a config's key as it was."""
    from suite.config.run import RunConfig
    from suite.harness.model import build_model

    full, hf, again = (build_model(ModelConfig(preset=preset, family=family, init=i), 0) for i in ("full", "hf", "hf"))
    for (name, a), b, c in zip(full.hf.named_parameters(), hf.hf.parameters(), again.hf.parameters()):
        assert torch.isfinite(b).all() and torch.equal(b, c), name
        assert float(b.detach().std()) == pytest.approx(float(a.detach().std()), rel=0.1, abs=1e-6), name
    assert any(not torch.equal(a, b) for a, b in zip(full.hf.parameters(), hf.hf.parameters()))
    assert "init" not in RunConfig(model=ModelConfig(preset=preset, family=family)).to_dict()["model"]
