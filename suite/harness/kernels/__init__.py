"""Hand-written Triton kernels for the GPU's training step: keyed dropout, attention with keyed dropout inside it,
and LAMB over every parameter at once.

Triton is imported only when a kernel is first asked for. Under TRITON_INTERPRET=1 (set before triton is imported)
the same kernels run on numpy, on CPU tensors: the tests hold them to their eager references that way. On CUDA a
kernel that cannot build or run is a KernelError naming the kernel: a timed cell never falls back to a slower path
without saying so (suite/core/cell.classify records it as the cell's error).
"""

from __future__ import annotations

import os


def fused_attention_takes(dtype) -> bool:
    """Whether the fused keyed attention takes `dtype`: fp16 and bf16. FP32 keeps the materialised attention
    (Triton's FP32 dot has no tensor-core path)."""
    return str(dtype) in ("torch.float16", "torch.bfloat16")


class KernelError(RuntimeError):
    """A Triton kernel failed to build or run; its message names the kernel and the reason."""

    def __init__(self, kernel: str, exc: BaseException):
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        super().__init__(f"Triton kernel {kernel} failed: {type(exc).__name__}: {reason}"[:300])
        self.kernel = kernel


def interpreted() -> bool:
    """Whether Triton runs its kernels on numpy (TRITON_INTERPRET=1): CPU tensors, exact for fp32 and fp16."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def missing() -> str:
    """Why the kernels cannot run in this process ('' where they can): no triton, or no place to run them."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc})"
    import torch

    if not interpreted() and not torch.cuda.is_available():
        return "no CUDA device and TRITON_INTERPRET is not set"
    return ""


def block_for(n: int, largest: int) -> int:
    """A power-of-two tile no larger than `largest`; smaller (16) under the interpreter, so that tiny test shapes
    still cross several tiles and the loops' edges are exercised."""
    if interpreted():
        return 16
    return largest
