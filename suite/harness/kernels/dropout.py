"""Keyed dropout as one Triton kernel: the counter hash of suite.harness.rng in 32-bit unsigned arithmetic.

Element e of sample b (e in the logical C order of the sample's shape) keeps its value, times `scale`, when
fmix32(fmix32(e ^ k1) + fmix32((offset + b) * 0x9E3779B9 ^ k0)) >= threshold (words mod 2**32): the bits of
rng.hash_words, which the eager hash computes in int64 lanes. One read of x, one write of the output; no mask is
stored (the backward applies the same kernel to the gradient). One compiled kernel per dtype, whatever the shape.

This module imports triton: import it only where a kernel is wanted (rng and the attention do, lazily).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from suite.harness.kernels import KernelError

BLOCK = 1024


@triton.jit
def fmix32(x):
    """MurmurHash3's finaliser on uint32 words (rng._fmix32)."""
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def sample_word(sample, k0):
    """The per-sample half of the hash for a sample index (uint32) and the site's first word."""
    return fmix32((sample * 0x9E3779B9) ^ k0.to(tl.uint32))


@triton.jit
def kept(sample_word, element, k1, threshold):
    """Whether each element (its uint32 index within the sample) survives the keyed draw."""
    word = fmix32(fmix32(element ^ k1.to(tl.uint32)) + sample_word)
    return word.to(tl.int64) >= threshold


def as_i32(word: int) -> int:
    """A 32-bit word as the signed int32 of the same bits: Triton then types every key word alike (int32) and the
    kernel's .to(uint32) takes the bits back, so no key value compiles a kernel variant of its own."""
    return word - 2**32 if word >= 2**31 else word


# The key's words and the sample offset vary per call: not specialised on (divisible by 16, equal to 1), so that
# one compiled kernel serves every call.
KEY_ARGS = ["k0", "k1", "offset", "threshold"]


@triton.jit(do_not_specialize=KEY_ARGS)
def _dropout_kernel(x_ptr, out_ptr, total, per_sample, k0, k1, offset, threshold, scale, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < total
    row = idx // per_sample
    element = (idx - row * per_sample).to(tl.uint32)
    keep = kept(sample_word((row + offset).to(tl.uint32), k0), element, k1, threshold)
    x = tl.load(x_ptr + idx, mask=inside)
    factor = tl.where(keep, scale, 0.0).to(x.dtype)
    tl.store(out_ptr + idx, x * factor, mask=inside)


def dropped(x: torch.Tensor, k0: int, k1: int, offset: int, threshold: int, scale: float) -> torch.Tensor:
    """x with the keyed mask applied: the elements whose word is below `threshold` zeroed, the rest times `scale`
    (the eager hash's bits and roundings)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    total = x.numel()
    if total == 0:
        return out
    per_sample = total // x.shape[0]
    if per_sample >= 2**32:
        raise ValueError(f"a sample of {per_sample} elements is past the hash's 2**32 element counter")
    try:
        _dropout_kernel[(triton.cdiv(total, BLOCK),)](
            x, out, total, per_sample, as_i32(k0), as_i32(k1), offset, threshold, scale, BLOCK=BLOCK
        )
    except Exception as exc:  # noqa: BLE001 — a cell names the kernel that failed, never a silent fallback
        raise KernelError("keyed_dropout", exc) from exc
    return out
