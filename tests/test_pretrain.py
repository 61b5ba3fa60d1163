"""Pre-training: a short run lowers the loss; a bert-mlm folder loads for sequence classification."""

import os

import pytest
import torch

from suite.config.errors import ConfigError
from suite.config.run import ModelConfig, RunConfig
from suite.tasks.pretrain import PretrainOptions, pretrain

FIXTURES = os.path.relpath(
    os.path.join(os.path.dirname(__file__), "fixtures", "glue"),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
)


def _run(family, steps, method="grad_accum", **options):
    return RunConfig(
        method=method,
        model=ModelConfig(family=family),
        micro_batch_size=4,
        num_micro_batches=2,
        seq_len=32,
        optimizer="adamw",
        lr=2e-3,
        schedule="linear",
        warmup_steps=2,
        steps=steps,
        device="cpu",
        options=options,
    )


def test_short_pretrain_lowers_the_loss(tmp_path):
    out = pretrain(
        _run("gpt2", 20), PretrainOptions(data_dir=FIXTURES, evals=2), torch.device("cpu"), tmp_path, log=lambda m: None
    )
    vals = [p["val_loss"] for p in out["val_curve"]]
    assert [p["step"] for p in out["val_curve"]] == [0, 10, 20]
    assert vals[-1] < vals[0] - 0.3
    assert out["val_ppl"] == pytest.approx(torch.tensor(vals[-1]).exp().item(), rel=1e-6)
    assert len(out["loss_curve"]) == 20


def test_bert_mlm_folders_load_for_classification(tmp_path):
    from transformers import BertForSequenceClassification

    out = pretrain(
        _run("bert-mlm", 10),
        PretrainOptions(data_dir=FIXTURES, evals=1),
        torch.device("cpu"),
        tmp_path,
        log=lambda m: None,
    )
    assert out["snapshot_step"] == 9 and out["final_step"] == 10
    model = BertForSequenceClassification.from_pretrained(out["final_folder"], num_labels=2)
    assert model.config.vocab_size == out["vocab_size"]
    assert os.path.isfile(os.path.join(out["snapshot_folder"], "tokenizer.json"))


def test_options_need_data_and_a_language_model():
    with pytest.raises(ConfigError, match="data_dir"):
        PretrainOptions.from_run(_run("gpt2", 2))
    with pytest.raises(ConfigError, match="unknown pre-training option"):
        PretrainOptions.from_run(_run("gpt2", 2, data_dir=FIXTURES, evalz=3))
    with pytest.raises(ConfigError, match="language-model family"):
        pretrain(_run("bert", 2), PretrainOptions(data_dir=FIXTURES), torch.device("cpu"), None)


@pytest.mark.slow
def test_bert_mlm_pretrain_then_finetune(tmp_path):
    out = pretrain(
        _run("bert-mlm", 10),
        PretrainOptions(data_dir=FIXTURES, evals=1, finetune_task="rte", finetune_epochs=1),
        torch.device("cpu"),
        tmp_path,
        log=lambda m: None,
    )
    assert 0.0 <= out["ft_score"] <= 100.0 and 0.0 <= out["ft_score_90"] <= 100.0
