"""BERT for masked language modelling: BERT's embeddings and blocks, then the MLM prediction head and loss."""

from __future__ import annotations

import torch
from torch import nn

from suite.harness.families.bert import BertFamily
from suite.harness.families.lm import lm_loss


class MLMHead(nn.Module):
    """BertOnlyMLMHead (transform, LayerNorm, decoder) and the loss over the masked positions."""

    def __init__(self, hf):
        super().__init__()
        self.cls = hf.cls

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, denom: int, attention_mask=None):
        logits = self.cls(hidden)  # padding needs no mask here: its labels are -100
        return lm_loss(logits, labels, denom), logits


class BertMLMFamily(BertFamily):
    """BertForMaskedLM with an untied decoder; its saved folder loads into BertForSequenceClassification."""

    name = "bert-mlm"
    objective = "mlm"  # labels are (B, S): the original token at masked positions, -100 elsewhere

    def build(self, cfg, attn_implementation: str) -> nn.Module:
        from transformers import BertConfig, BertForMaskedLM

        # Untied: the word embeddings (layer 0) and the decoder (the last layer) would otherwise be one
        # weight owned by two pipeline stages or two L2L slots.
        common = dict(
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout,
            tie_word_embeddings=False,
        )
        if cfg.pretrained:
            hf = BertForMaskedLM.from_pretrained(cfg.pretrained, attn_implementation=attn_implementation, **common)
        else:
            hf_cfg = BertConfig(
                vocab_size=cfg.vocab_size,
                hidden_size=cfg.hidden,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                intermediate_size=cfg.intermediate,
                max_position_embeddings=cfg.max_seq,
                **common,
            )
            hf = BertForMaskedLM._from_config(hf_cfg, attn_implementation=attn_implementation)
        # Untying also separates the decoder's bias from the head's `bias`, leaving the latter unused;
        # both live in the head, so share them again as BertForMaskedLM intends.
        hf.cls.predictions.decoder.bias = hf.cls.predictions.bias
        if hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight:
            raise ValueError("BERT's MLM decoder shares the word embeddings; the layered view needs them untied")
        return hf

    def split(self, hf, cfg) -> list[nn.Module]:
        return [hf.bert.embeddings, *hf.bert.encoder.layer, MLMHead(hf)]
