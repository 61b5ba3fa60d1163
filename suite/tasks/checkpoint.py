"""Weights on disk for fine-tuning: the best-dev checkpoint, atomic saves, and digests of whole models."""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import torch

from suite.config.files import write_atomic


class BestCheckpoint:
    """The weights of the best dev score so far (the earliest on ties): saved to `path`, or kept in memory."""

    def __init__(self, path: Path | None = None):
        self.path, self.score, self.step, self.state = path, None, None, None

    def offer(self, score: float, step: int, state: dict[str, torch.Tensor]) -> bool:
        if math.isnan(score) or (self.score is not None and score <= self.score):
            return False
        self.score, self.step = score, step
        if self.path is None:
            self.state = {k: v.clone() for k, v in state.items()}
        else:
            save_weights(state, self.path)
        return True

    def load(self) -> dict[str, torch.Tensor] | None:
        if self.path is None or self.score is None:
            return self.state
        return torch.load(self.path, weights_only=True)


def save_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    """Atomic, so a killed cell never leaves half a checkpoint."""
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(path, buf.getvalue())


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of the weights by name: equal digests mean bitwise-equal models."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]
