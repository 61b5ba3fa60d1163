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
