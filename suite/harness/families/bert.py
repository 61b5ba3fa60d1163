"""BERT for sequence classification as embed, encoder blocks, and a pooler+classifier+loss head."""

from __future__ import annotations

import torch
from torch import nn

from suite.harness.device import flag


class BertHead(nn.Module):
    """Pooler + dropout + classifier + loss of BertForSequenceClassification, as one layer."""

    def __init__(self, hf, pooling: str = "cls"):
        super().__init__()
        self.pooler = hf.bert.pooler
        self.dropout = hf.dropout
        self.classifier = hf.classifier
        self.num_labels = hf.config.num_labels
        self.pooling = pooling

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, denom: int, attention_mask=None):
        if self.pooling == "mean":  # what the pooler's dense layer reads: the tokens' mean, not [CLS]
            pooled = self.pooler.activation(self.pooler.dense(masked_mean(hidden, attention_mask)))
        else:
            pooled = self.pooler(hidden)
        logits = self.classifier(self.dropout(pooled))
        if self.num_labels == 1:  # regression (STS-B)
            loss = torch.nn.functional.mse_loss(logits.squeeze(-1).float(), labels.float(), reduction="sum")
        else:
            loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        return loss / denom, logits


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over each sample's unpadded tokens (B, S, H) -> (B, H), summed in FP32."""
    if attention_mask is None:
        return hidden.float().mean(1).to(hidden.dtype)
    m = attention_mask.to(torch.float32).unsqueeze(-1)
    return ((hidden.float() * m).sum(1) / m.sum(1).clamp(min=1.0)).to(hidden.dtype)


class BertFamily:
    """The BERT mapping: layer 0 is BertEmbeddings, then each BertLayer, then BertHead."""

    name = "bert"
    objective = "classify"  # labels are (B,) classes, or floats for regression

    def build(self, cfg, attn_implementation: str) -> nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        common = dict(
            num_labels=cfg.num_labels,
            hidden_dropout_prob=cfg.dropout,
            attention_probs_dropout_prob=cfg.attention_dropout,
        )
        if cfg.pretrained:
            hf = BertForSequenceClassification.from_pretrained(
                cfg.pretrained, attn_implementation=attn_implementation, **common
            )
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
            hf = BertForSequenceClassification._from_config(hf_cfg, attn_implementation=attn_implementation)
        hf.config.problem_type = "regression" if cfg.num_labels == 1 else "single_label_classification"
        return hf

    def split(self, hf, cfg) -> list[nn.Module]:
        return [hf.bert.embeddings, *hf.bert.encoder.layer, BertHead(hf, cfg.pooling)]

    def mask(self, mb) -> torch.Tensor | None:
        """Boolean (B, 1, 1, S) mask, True = attend; None when nothing is padded (the fast path). The batch
        says which from its host copy (MicroBatch.dense); only a batch made on a device is read back here."""
        dense = mb.dense if mb.dense is not None else flag(mb.attention_mask.all(), counted=True)
        if mb.attention_mask is None or dense:
            return None
        return mb.attention_mask.bool()[:, None, None, :]

    def embed(self, module, ctx) -> torch.Tensor:
        return module(input_ids=ctx.mb.input_ids, token_type_ids=ctx.mb.token_type_ids)

    def block(self, module, x, ctx) -> torch.Tensor:
        out = module(x, attention_mask=ctx.mask)
        return out[0] if isinstance(out, tuple) else out  # transformers 4.x returns a tuple, 5.x a tensor

    def gradient_free(self, hf) -> set[str]:
        """Key biases: a key bias shifts every score of a query equally and softmax ignores that."""
        return {n for n, _ in hf.named_parameters() if n.endswith("attention.self.key.bias")}
