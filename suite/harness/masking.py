"""BERT's masked-LM corruption, decided in the data and keyed by (seed, step, sample): 15% of tokens, 80/10/10."""

from __future__ import annotations

import hashlib

import torch

from suite.harness.families.lm import IGNORE

MASK_RATE = 0.15
MASK_ID = 4  # [MASK] in suite.tasks.tokenizer's vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK] are ids 0..4)
NUM_SPECIAL = 5  # ids below this are never chosen, and never drawn as random replacements


def _generator(seed: int, step: int, sample: int) -> torch.Generator:
    digest = hashlib.blake2b(f"mlm/{seed}/{step}/{sample}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    seed: int,
    step: int,
    vocab_size: int,
    offset: int = 0,
    mask_id: int = MASK_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted ids, labels) for a (B, S) batch whose row i is sample offset+i of minibatch `step`.

    Each sample draws from its own generator keyed by (seed, step, sample), so the result does not
    depend on the batch it sits in or on how a method splits it. Of the non-special, non-padding
    tokens, 15% (at least one) become targets: 80% of those are replaced by [MASK], 10% by a random
    token, 10% kept. Labels hold the original token at targets and -100 elsewhere.
    """
    ids, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE)
    valid = input_ids >= NUM_SPECIAL
    if attention_mask is not None:
        valid &= attention_mask.bool()
    for row in range(ids.shape[0]):
        g = _generator(seed, step, offset + row)
        u, action, repl = (
            torch.rand(ids.shape[1], generator=g),
            torch.rand(ids.shape[1], generator=g),
            torch.randint(NUM_SPECIAL, vocab_size, (ids.shape[1],), generator=g),
        )
        chosen = valid[row] & (u < MASK_RATE)
        if not chosen.any() and valid[row].any():  # every sample keeps at least one target
            chosen[torch.nonzero(valid[row])[torch.argmin(u[valid[row]])]] = True
        labels[row, chosen] = input_ids[row, chosen]
        ids[row, chosen & (action < 0.8)] = mask_id
        rand = chosen & (action >= 0.8) & (action < 0.9)
        ids[row, rand] = repl[rand]
    return ids, labels
