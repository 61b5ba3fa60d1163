"""The language-model loss shared by the LM families: per-sample mean token cross-entropy, summed, over denom."""

from __future__ import annotations

import torch

IGNORE = -100  # label of a token that is not a target (padding, unmasked MLM positions)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, denom: int) -> torch.Tensor:
    """Each sample's mean cross-entropy over its target tokens, summed over the micro-batch, divided by denom.

    Averaging within a sample first and dividing the sum by the minibatch size (as the classification
    head does) makes the minibatch loss independent of how it is cut into micro-batches. A sample with
    no target token contributes 0.
    """
    per_token = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none"
    ).view(labels.shape)
    return _share(per_token, labels, denom)


def _share(per_token: torch.Tensor, labels: torch.Tensor, denom: int) -> torch.Tensor:
    """Each sample's mean over its target tokens, summed over the micro-batch, divided by denom."""
    count = (labels != IGNORE).sum(1)
    per_sample = per_token.sum(1) / count.clamp(min=1)
    return per_sample.sum() / denom


LOSS_CHUNK = 1024  # tokens a chunk where the LM head's loss is chunked
LOGITS_BYTES = 2**28  # a micro-batch's FP32 logits past this (256 MiB) are chunked when nothing asks otherwise


def chunk_for(tokens: int, vocab: int, setting: int | None) -> int:
    """Tokens a chunk of the head's logits (0: all at once): `setting` where given (model.loss_chunk), else
    LOSS_CHUNK once the micro-batch's FP32 logits would pass LOGITS_BYTES (Llama 3's 128256-wide head at 4096
    tokens: 2.1 GB a sequence, and as much again for their gradient)."""
    if setting is not None:
        return setting
    return LOSS_CHUNK if tokens * vocab * 4 > LOGITS_BYTES else 0


def _token_losses(hidden: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight)
    return torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="none")


def chunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, denom: int, chunk: int):
    """lm_loss(hidden @ weight.T, labels, denom) with the logits made `chunk` tokens at a time and made again in
    the backward (checkpointed), so that no more than one chunk's logits and their gradient live at once. Each
    token's cross-entropy is the whole head's (a row of logits depends on its own token alone); the per-sample
    means and the sum are lm_loss's."""
    from torch.utils.checkpoint import checkpoint

    flat_h, flat_y = hidden.flatten(0, 1), labels.flatten()
    per_token = torch.cat(
        [
            checkpoint(_token_losses, h, y, weight, use_reentrant=False, preserve_rng_state=False)  # no draws
            for h, y in zip(flat_h.split(chunk), flat_y.split(chunk))
        ]
    ).view(labels.shape)
    return _share(per_token, labels, denom)
