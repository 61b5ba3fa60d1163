"""Minibatches, their split into micro-batches, and seeded synthetic token batches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator

import torch

from suite.harness.device import is_fake
from suite.harness.families.lm import IGNORE
from suite.harness.masking import NUM_SPECIAL, mask_tokens

OBJECTIVES = ("classify", "mlm", "clm")


@dataclass
class MicroBatch:
    """One micro-batch; `offset` is its first sample's index in the minibatch (keys its dropout)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    token_type_ids: torch.Tensor | None
    labels: torch.Tensor
    offset: int = 0
    index: int = 0
    # Per sample, whether every token is attended: read once from the host's copy when the batch is made, and
    # carried through split, shard and to(), so that no step reads a device's mask back (MicroBatch.dense).
    attended: tuple[bool, ...] | None = None

    def __post_init__(self):
        if self.attended is None:
            self.attended = _attended(self.attention_mask, int(self.input_ids.shape[0]))

    @property
    def dense(self) -> bool | None:
        """No sample is padded (None for a batch made on a device, whose mask the family then reads there)."""
        return None if self.attended is None else all(self.attended)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device, non_blocking: bool = False) -> "MicroBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return dataclasses.replace(
            self,
            input_ids=move(self.input_ids),
            attention_mask=move(self.attention_mask),
            token_type_ids=move(self.token_type_ids),
            labels=move(self.labels),
        )


def _attended(mask: torch.Tensor | None, rows: int) -> tuple[bool, ...] | None:
    """Per row of `mask`, whether every token is attended, read on the host; None for a mask already on a device.
    A counted step's fake mask takes the path a step normally takes (nothing padded)."""
    if mask is None or is_fake(mask):
        return (True,) * rows
    if mask.device.type != "cpu":
        return None
    return tuple(mask.bool().all(dim=1).tolist())


@dataclass
class MiniBatch(MicroBatch):
    """The samples of one optimizer step."""

    def split(self, num_micro_batches: int) -> list[MicroBatch]:
        """Equal contiguous micro-batches; the minibatch size must divide evenly."""
        n = self.size
        if num_micro_batches < 1 or n % num_micro_batches:
            raise ValueError(
                f"a minibatch of {n} samples cannot be split into {num_micro_batches} "
                f"equal micro-batches (choose a divisor of {n})"
            )
        b = n // num_micro_batches
        cut = lambda t, i: None if t is None else t[i * b : (i + 1) * b]  # noqa: E731
        return [
            MicroBatch(
                cut(self.input_ids, i),
                cut(self.attention_mask, i),
                cut(self.token_type_ids, i),
                cut(self.labels, i),
                offset=self.offset + i * b,
                index=i,
                attended=cut(self.attended, i),
            )
            for i in range(num_micro_batches)
        ]

    def shard(self, rank: int, world: int) -> "MiniBatch":
        """This rank's contiguous share of a global minibatch (offsets stay global, so keys match one rank)."""
        if self.size % world:
            raise ValueError(f"a minibatch of {self.size} samples cannot be sharded over {world} ranks")
        b = self.size // world
        cut = lambda t: None if t is None else t[rank * b : (rank + 1) * b]  # noqa: E731
        return MiniBatch(
            cut(self.input_ids),
            cut(self.attention_mask),
            cut(self.token_type_ids),
            cut(self.labels),
            offset=self.offset + rank * b,
            attended=cut(self.attended),
        )


def synthetic_batch(
    step: int,
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    num_labels: int,
    seed: int,
    padded: bool = False,
    objective: str = "classify",
) -> MiniBatch:
    """A reproducible random minibatch for `step`: uniform tokens, labels, optional random padding.

    `objective` is the model family's: `classify` draws (B,) labels; `clm` makes the labels the
    token ids (-100 at padding; the head shifts them); `mlm` corrupts the tokens (suite.harness.masking)
    and labels the targets.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {list(OBJECTIVES)}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ids = torch.randint(1, vocab_size, (batch_size, seq_len), generator=g)
    mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    if padded:  # right padding to a random length of at least 2 tokens
        lengths = torch.randint(2, seq_len + 1, (batch_size,), generator=g)
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
        ids = ids * mask
    types = torch.zeros(batch_size, seq_len, dtype=torch.long)
    if objective == "clm":
        return MiniBatch(ids, mask, types, ids.masked_fill(mask == 0, IGNORE))
    if objective == "mlm":
        ids = ids.clamp(min=NUM_SPECIAL) * mask  # special ids stay special; padding stays 0
        ids, labels = mask_tokens(ids, mask, seed, step, vocab_size)
        return MiniBatch(ids, mask, types, labels)
    if num_labels == 1:
        labels = torch.rand(batch_size, generator=g) * 5.0
    else:
        labels = torch.randint(0, num_labels, (batch_size,), generator=g)
    return MiniBatch(ids, mask, types, labels)


def synthetic_batches(run, padded: bool = False) -> Iterator[MiniBatch]:
    """Endless synthetic minibatches for a RunConfig (the same stream for every method)."""
    from suite.harness.families import FAMILIES

    model = run.model.resolved()
    objective = FAMILIES[model.family].objective
    step = 0
    while True:
        yield synthetic_batch(
            step, run.batch_size, run.seq_len, model.vocab_size, model.num_labels, run.seed, padded, objective
        )
        step += 1
