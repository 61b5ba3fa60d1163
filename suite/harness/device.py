"""Device resolution, autocast and synchronisation helpers shared by methods and measurement."""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """'auto' picks CUDA when present; on CUDA each rank takes its local GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda was asked for but torch sees no CUDA device; use device=cpu or auto")
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def autocast(device: torch.device, precision: str):
    """torch.autocast for 16-bit precisions, a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
