"""A local pre-training corpus: GLUE training sentences, a WordPiece vocabulary, fixed-length blocks, seeded batches."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import torch

from suite.harness.data import MiniBatch
from suite.harness.masking import mask_tokens

VALID_EVERY = 10  # one text in ten (chosen by a hash of the text) is held out for validation


class CorpusError(ValueError):
    """The corpus folder or its files are missing or unusable; the message names what was expected."""


def corpus_texts(data_dir: str | os.PathLike) -> list[str]:
    """Every distinct sentence of the GLUE training TSVs under `data_dir`, in task then file order."""
    from suite.tasks.glue import TASKS, _read_tsv

    folder = os.fspath(data_dir)
    expected = ", ".join(f"{t.folder}/train.tsv" for t in TASKS.values())
    if not os.path.isdir(folder):
        raise CorpusError(
            f"corpus folder {folder!r} does not exist; give a folder of GLUE TSVs holding any of: "
            f"{expected} (--data-dir or SUITE_GLUE_DIR)"
        )
    texts: dict[str, None] = {}
    for task in sorted(TASKS, key=lambda k: TASKS[k].folder):
        path = os.path.join(folder, TASKS[task].folder, "train.tsv")
        if os.path.isfile(path):
            cols = _read_tsv(TASKS[task], path)
            for t in (*cols["text_a"], *cols["text_b"]):
                if t and t.strip():
                    texts.setdefault(t.strip(), None)
    if not texts:
        raise CorpusError(
            f"corpus folder {folder!r} holds no GLUE training file with text; expected any of: {expected}"
        )
    return list(texts)


def _held_out(text: str) -> bool:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % VALID_EVERY == 0


def _blocks(ids: list[list[int]], seq_len: int, objective: str, cls: int, sep: int) -> torch.Tensor:
    """Texts joined by [SEP] and cut into full blocks: GPT-2 takes seq_len tokens, BERT [CLS] + seq_len-2 + [SEP]."""
    stream = [tok for text in ids for tok in (*text, sep)]
    body = seq_len if objective == "clm" else seq_len - 2
    rows = [stream[i : i + body] for i in range(0, len(stream) - body + 1, body)]
    if objective != "clm":
        rows = [[cls, *r, sep] for r in rows]
    return torch.tensor(rows, dtype=torch.long).view(-1, seq_len)


@dataclass
class Corpus:
    """Packed train and validation blocks; batch(step) is a pure function of (seed, step)."""

    tokenizer: object
    train: torch.Tensor
    valid: torch.Tensor
    objective: str
    seed: int
    _orders: dict = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders = {epoch: torch.randperm(len(self.train), generator=g)}  # keep one epoch's order
        return self._orders[epoch]

    def _batch(self, ids: torch.Tensor, step: int, offset: int = 0) -> MiniBatch:
        ones, zeros = torch.ones_like(ids), torch.zeros_like(ids)
        if self.objective == "clm":
            return MiniBatch(ids, ones, zeros, ids.clone())
        masked, labels = mask_tokens(ids, ones, self.seed, step, self.vocab_size, offset, self.tokenizer.mask_token_id)
        return MiniBatch(masked, ones, zeros, labels)

    def batch(self, step: int, batch_size: int) -> MiniBatch:
        """The minibatch of `step`: samples step*B .. step*B+B-1 of a stream of seeded per-epoch permutations."""
        n = len(self.train)
        picks = [int(self._order(k // n)[k % n]) for k in range(step * batch_size, (step + 1) * batch_size)]
        return self._batch(self.train[picks], step)

    def validation(self, batch_size: int) -> list[MiniBatch]:
        """The held-out blocks in order; MLM masks keyed by step -1 and the block's index, the same every time."""
        return [self._batch(self.valid[i : i + batch_size], -1, i) for i in range(0, len(self.valid), batch_size)]


def build_corpus(
    data_dir: str | os.PathLike, seq_len: int, objective: str, seed: int, vocab_size: int, tokenizer=None
) -> Corpus:
    """Read the texts, train a WordPiece on the training texts (unless `tokenizer` is given), pack both splits."""
    from suite.tasks.tokenizer import load_tokenizer

    if objective not in ("mlm", "clm"):
        raise CorpusError(f"a corpus serves language-model families (objective mlm or clm), not {objective!r}")
    texts = corpus_texts(data_dir)
    train = [t for t in texts if not _held_out(t)]
    valid = [t for t in texts if _held_out(t)]
    tok = tokenizer if tokenizer is not None else load_tokenizer(None, train, vocab_size)
    encode = lambda ts: tok(ts, add_special_tokens=False)["input_ids"] if ts else []  # noqa: E731
    cls, sep = tok.cls_token_id, tok.sep_token_id
    blocks = {
        name: _blocks(encode(ts), seq_len, objective, cls, sep) for name, ts in (("train", train), ("valid", valid))
    }
    for name, b in blocks.items():
        if len(b) == 0:
            raise CorpusError(
                f"the {name} split of the corpus in {os.fspath(data_dir)!r} is shorter than one "
                f"block of {seq_len} tokens; give more text or a shorter seq_len"
            )
    return Corpus(tok, blocks["train"], blocks["valid"], objective, seed)
