"""GPT-2 for causal language modelling as embed (wte+wpe+dropout), GPT2Blocks, and an ln_f+lm_head+loss head."""

from __future__ import annotations

import torch
from torch import nn

from suite.harness.families.lm import lm_loss


def causal_mask(mb) -> torch.Tensor:
    """Boolean (B, 1, S, S) causal and padding mask, True = attend; always built, because the keyed dropout path
    applies only the mask it is given (SDPA would add causality by itself without one)."""
    s = mb.input_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=mb.input_ids.device).tril()
    if mb.attention_mask is None:
        return causal[None, None].expand(mb.size, 1, s, s)
    return causal[None, None] & mb.attention_mask.bool()[:, None, None, :]


class GPT2Embed(nn.Module):
    """Token and position embeddings and their dropout (GPT2Model's forward up to the first block)."""

    def __init__(self, hf):
        super().__init__()
        self.wte, self.wpe, self.drop = hf.transformer.wte, hf.transformer.wpe, hf.transformer.drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.drop(self.wte(input_ids) + self.wpe(positions)[None])


class GPT2Head(nn.Module):
    """Final layer norm, LM head and loss; labels are the input ids (-100 at padding), shifted here."""

    def __init__(self, hf):
        super().__init__()
        self.ln_f, self.lm_head = hf.transformer.ln_f, hf.lm_head

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, denom: int, attention_mask=None):
        logits = self.lm_head(self.ln_f(hidden))  # padding needs no mask here: its labels are -100
        return lm_loss(logits[:, :-1], labels[:, 1:], denom), logits


class GPT2Family:
    """The GPT-2 mapping: layer 0 is GPT2Embed, then each GPT2Block, then GPT2Head."""

    name = "gpt2"
    objective = "clm"  # labels are (B, S) token targets; see suite.harness.data

    def build(self, cfg, attn_implementation: str) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        # Untied: a weight shared by the embeddings (layer 0) and the LM head (the last layer) would be
        # owned by two pipeline stages or two L2L slots, each updating its own copy.
        common = dict(
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.attention_dropout,
            tie_word_embeddings=False,
            bos_token_id=3,
            eos_token_id=3,
        )  # [SEP] separates texts (suite.tasks.corpus)
        if cfg.pretrained:
            hf = GPT2LMHeadModel.from_pretrained(cfg.pretrained, attn_implementation=attn_implementation, **common)
        else:
            hf_cfg = GPT2Config(
                vocab_size=cfg.vocab_size,
                n_embd=cfg.hidden,
                n_layer=cfg.layers,
                n_head=cfg.heads,
                n_inner=cfg.intermediate,
                n_positions=cfg.max_seq,
                **common,
            )
            hf = GPT2LMHeadModel._from_config(hf_cfg, attn_implementation=attn_implementation)
        if hf.lm_head.weight is hf.transformer.wte.weight:
            raise ValueError("GPT-2's LM head shares the input embedding; the layered view needs them untied")
        return hf

    def split(self, hf, cfg) -> list[nn.Module]:
        return [GPT2Embed(hf), *hf.transformer.h, GPT2Head(hf)]

    def mask(self, mb) -> torch.Tensor:
        return causal_mask(mb)

    def embed(self, module, ctx) -> torch.Tensor:
        return module(ctx.mb.input_ids)

    def block(self, module, x, ctx) -> torch.Tensor:
        out = module(x, attention_mask=ctx.mask)
        return out[0] if isinstance(out, tuple) else out

    def gradient_free(self, hf) -> set[str]:
        """None as whole tensors: the key bias is the middle third of the fused c_attn.bias, whose query
        and value thirds have real gradients, so the tensor stays gated (docs/model-families.md)."""
        return set()
