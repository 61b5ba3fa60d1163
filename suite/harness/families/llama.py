"""Llama-style decoders (Llama 3, and any model whose config differs only in sizes) as embed (embed_tokens), one
LlamaBlock per decoder layer, and a norm+lm_head+loss head: RMSNorm, SwiGLU, grouped-query attention, rotary
positions, untied input and output embeddings, no dropout."""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

from suite.harness.device import is_fake
from suite.harness.families.gpt2 import causal_mask
from suite.harness.families.lm import chunk_for, chunked_lm_loss, lm_loss

ROPE_THETA = 500000.0  # Llama 3's; its 3.1/3.2 frequency scaling (rope_type "llama3") is left out: values, not cost
RMS_EPS = 1e-5


class LlamaEmbed(nn.Module):
    """The token embedding (Llama has no position embedding and no dropout)."""

    def __init__(self, hf):
        super().__init__()
        self.embed_tokens = hf.model.embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class LlamaBlock(nn.Module):
    """One decoder layer, with the model's rotary embedding beside it (not a submodule: it has no parameters, and
    a device slot or a pipeline stage holding the block must not own, convert or move it; its forward takes a copy of
    it on the hidden states' device, made once: rotary_on)."""

    def __init__(self, layer, rotary):
        super().__init__()
        self.layer = layer
        self.__dict__["rotary"] = rotary

    def forward(self, x: torch.Tensor, mask, scratch: dict) -> torch.Tensor:
        # cos and sin once per micro-batch, dtype and device (every block reads the same positions 0..S-1)
        key = ("rope", x.dtype, x.device)
        if key not in scratch:
            positions = torch.arange(x.shape[1], device=x.device)[None]
            scratch[key] = (positions, rotary_on(self.rotary, x)(x, positions))
        positions, cos_sin = scratch[key]
        return self.layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a model's rotary -> {device: its copy there}


def rotary_on(rotary: nn.Module, x: torch.Tensor) -> nn.Module:
    """The rotary embedding with its inverse frequencies on `x`'s device. Where a relay's slot or a pipeline stage
    holds the block on a device the model's own rotary is not on (it stays on the host), Hugging Face's forward would
    copy them there at every call, a blocking host-to-device copy each micro-batch: a copy of the rotary made once a
    device instead (Llama 3's frequencies are fixed once built). A counted step's fake tensors use it as it is."""
    if rotary.inv_freq.device == x.device or is_fake(x):
        return rotary
    copies = _COPIES.setdefault(rotary, {})
    if x.device not in copies:
        copies[x.device] = copy.deepcopy(rotary).to(x.device)
    return copies[x.device]


class LlamaHead(nn.Module):
    """Final RMSNorm, LM head and loss; labels are the input ids (-100 at padding), shifted here. Where the logits
    are large (model.loss_chunk, lm.chunk_for) the loss is made a chunk of tokens at a time in training, and no
    logits are returned (None)."""

    def __init__(self, hf, loss_chunk: int | None = None):
        super().__init__()
        self.norm, self.lm_head = hf.model.norm, hf.lm_head
        self.loss_chunk = loss_chunk

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor, denom: int, attention_mask=None):
        normed = self.norm(hidden)
        tokens, vocab = normed.shape[0] * (normed.shape[1] - 1), self.lm_head.out_features
        chunk = chunk_for(tokens, vocab, self.loss_chunk) if torch.is_grad_enabled() else 0
        if chunk and self.lm_head.bias is None:
            return chunked_lm_loss(normed[:, :-1], self.lm_head.weight, labels[:, 1:], denom, chunk), None
        logits = self.lm_head(normed)
        return lm_loss(logits[:, :-1], labels[:, 1:], denom), logits


class LlamaFamily:
    """The Llama mapping: layer 0 is LlamaEmbed, then each LlamaBlock, then LlamaHead."""

    name = "llama"
    objective = "clm"
    ffn_matmuls = 3  # SwiGLU: gate, up and down projections (suite.measure.flops)

    def build(self, cfg, attn_implementation: str) -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        common = dict(
            attention_dropout=cfg.attention_dropout, tie_word_embeddings=False, bos_token_id=3, eos_token_id=3
        )
        if cfg.pretrained:
            hf = LlamaForCausalLM.from_pretrained(cfg.pretrained, attn_implementation=attn_implementation, **common)
        else:
            hf_cfg = LlamaConfig(
                vocab_size=cfg.vocab_size,
                hidden_size=cfg.hidden,
                intermediate_size=cfg.intermediate,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads or cfg.heads,
                max_position_embeddings=cfg.max_seq,
                rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                rms_norm_eps=RMS_EPS,
                **common,
            )
            hf = LlamaForCausalLM._from_config(hf_cfg, attn_implementation=attn_implementation)
        if hf.lm_head.weight is hf.model.embed_tokens.weight:
            raise ValueError("the LM head shares the input embedding; the layered view needs them untied")
        return hf

    def split(self, hf, cfg) -> list[nn.Module]:
        rotary = hf.model.rotary_emb
        blocks = [LlamaBlock(layer, rotary) for layer in hf.model.layers]
        return [LlamaEmbed(hf), *blocks, LlamaHead(hf, cfg.loss_chunk)]

    def mask(self, mb) -> torch.Tensor | None:
        """None when nothing is padded (decided on the host, from the batch): SDPA is then causal by itself
        (is_causal), as Hugging Face runs an unmasked Llama, and takes its fused kernels (flash attention on CUDA,
        the CPU's flash kernel in a count), which never hold the S x S scores; a padded batch gets the explicit
        mask. Llama has no dropout, so no keyed mask needs the scores either."""
        return None if mb.attention_mask is None else causal_mask(mb)

    def embed(self, module, ctx) -> torch.Tensor:
        return module(ctx.mb.input_ids)

    def block(self, module, x, ctx) -> torch.Tensor:
        return module(x, ctx.mask, ctx.scratch)

    def gradient_free(self, hf) -> set[str]:
        """None: Llama's projections have no biases."""
        return set()
