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
    count = (labels != IGNORE).sum(1)
    per_sample = per_token.sum(1) / count.clamp(min=1)
    return per_sample.sum() / denom
