"""Keyed randomness: dropout masks that depend on (seed, step, sample, layer, site), never on execution order.

Every method runs the same layers in a different order (micro-batch-major, layer-major, 1F1B), so
dropout cannot draw from a global generator. Keying by the sample's index in the minibatch (micro-batch
offset + row) makes any split into micro-batches draw the same masks as one big batch, and a recompute
draws them again exactly. Two ways to draw, by device (PATHS):

- `per_sample` (the CPU): each sample's uniforms come from torch's generator (MT19937) seeded by a hash
  of (seed, step, layer, site, sample): one draw per sample. On a CPU this measured faster than a
  vectorised hash; its bits are those of every CPU record.
- `hash_triton` (CUDA, any non-CPU device): a counter-based hash of (key, sample, element) in 32-bit
  unsigned arithmetic, compared with an integer threshold: all samples of a dropout site in one hand-written
  Triton kernel (suite/harness/kernels/dropout.py: one read, one write, one compiled kernel per dtype whatever the
  shapes, precisions and autocast state of the cells a process runs), no uniform tensor, no saved mask (the
  backward draws it again). The attention's own dropout draws the same bits inside the fused attention kernel
  (suite/harness/kernels/attention.py). A kernel that fails raises KernelError: the cell is an error, never a
  silent fallback. `hash` is the same arithmetic in eager torch ops (int64 lanes, a constant number of them
  whatever the batch size): the reference the kernels are tested against. Both give the same bits on any device.

The two draw different bits, so a device's cell keys name its harness version (harness_key).
"""

from __future__ import annotations

import functools
import hashlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from suite.harness.device import is_fake

PATHS = ("per_sample", "hash", "hash_triton")
# The harness version of each device type's draws: 1 for the per-sample generator (every CPU record), 2 for the
# counter hash. A cell key carries it only where it is not 1, so that the keys of CPU cells stay as they were.
HARNESS_VERSION = {"per_sample": 1, "hash": 2, "hash_triton": 2}


@dataclass
class _Key:
    seed: int
    step: int
    layer: int
    offset: int
    site: int = 0


_local = threading.local()
_forced: list[str] = []  # a path asked for by `forced(...)` (tests, benchmarks), innermost last
_used: dict[str, str] = {}  # path -> "" for each path this cell's draws took (reset per cell), for the record


def path_for(device: torch.device) -> str:
    """The path a draw on `device` takes: per_sample on the CPU (and on `meta`, where a count builds what stands
    for it), the Triton hash elsewhere; unless forced."""
    if _forced:
        return _forced[-1]
    return "per_sample" if torch.device(device).type in ("cpu", "meta") else "hash_triton"


def harness_key(device_type: str) -> dict:
    """What a cell key adds for the draws on `device_type`: nothing where they are version 1."""
    version = HARNESS_VERSION[path_for(torch.device(device_type))]
    return {} if version == 1 else {"harness": version}


@contextmanager
def forced(path: str):
    """Within this block every keyed draw takes `path` (one of PATHS), whatever the device."""
    if path not in PATHS:
        raise ValueError(f"dropout path {path!r} is not one of {list(PATHS)}")
    _forced.append(path)
    try:
        yield
    finally:
        _forced.pop()


def used() -> dict[str, str]:
    """The paths the keyed draws took since the last reset() (a cell's own), each with a note ('' where none)."""
    return dict(_used)


def note(path: str, how: str = "") -> None:
    """Record that a draw took `path` (the attention's fused kernel notes its own)."""
    _used.setdefault(path, how)


def reset() -> None:
    """Forget the paths taken so far: each cell records only its own (suite/core/cell.execute calls it)."""
    _used.clear()


def seed_of(seed: int, step: int, layer: int, site: int, sample: int) -> int:
    """A 63-bit generator seed from the key tuple (blake2b: well mixed, stable across platforms)."""
    digest = hashlib.blake2b(f"{seed}/{step}/{layer}/{site}/{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def site_words(seed: int, step: int, layer: int, site: int) -> tuple[int, int]:
    """Two 32-bit words keying one dropout site of one step (the hash path adds the sample and element)."""
    digest = hashlib.blake2b(f"hash/{seed}/{step}/{layer}/{site}".encode(), digest_size=8).digest()
    word = int.from_bytes(digest, "little")
    return word & _M32, word >> 32


_generators: dict[torch.device, torch.Generator] = {}


@contextmanager
def keyed(seed: int, step: int, layer: int, sample_offset: int):
    """Within this block, dropout calls draw masks keyed by (seed, step, layer, call order, sample)."""
    prev = getattr(_local, "key", None)
    _local.key = _Key(seed, step, layer, sample_offset)
    try:
        yield
    finally:
        _local.key = prev


def _next_site() -> tuple[_Key, int]:
    key = getattr(_local, "key", None)
    if key is None:
        raise RuntimeError(
            "dropout ran outside suite.rng.keyed(...): every layer call must be keyed "
            "so that masks do not depend on execution order"
        )
    site, key.site = key.site, key.site + 1
    return key, site


def keyed_uniform(shape: torch.Size, device: torch.device) -> torch.Tensor:
    """Uniform [0, 1) floats of `shape` (dim 0 = samples) from the active key, one generator draw per sample
    (the per_sample path); advances the site counter."""
    key, site = _next_site()
    out = torch.empty(shape, device=device)
    if is_fake(out):  # a counted step: the mask's bytes matter, not its bits
        return out.uniform_()
    gen = _generators.get(device)
    if gen is None:
        gen = _generators[device] = torch.Generator(device=device)
    for row in range(shape[0]):
        gen.manual_seed(seed_of(key.seed, key.step, key.layer, site, key.offset + row))
        torch.rand(shape[1:], generator=gen, device=device, out=out[row])
    return out


# --- the counter hash: 32-bit words held in int64 lanes, never overflowing them, so every backend agrees ---
_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for words x in [0, 2**32): split so that no product passes 2**48."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser: a bijection of 32-bit words in which every input bit flips every output bit
    with probability about 1/2."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def hash_words(shape: tuple[int, ...], device, k0: int, k1: int, offset: int) -> torch.Tensor:
    """A 32-bit word (in int64) per element of `shape`, from (site words, sample offset + row, element index
    within the sample). Elements are numbered in the logical C order of shape[1:], so the words do not depend
    on memory layout, on the batch a sample sits in, or on the device."""
    n = 1
    for d in shape[1:]:
        n *= d
    if n >= 2**32:
        raise ValueError(f"a sample of {n} elements is past the hash's 2**32 element counter")
    lead = (shape[0],) + (1,) * (len(shape) - 1)
    sample = torch.arange(shape[0], device=device, dtype=torch.int64).view(lead) + offset
    element = torch.arange(n, device=device, dtype=torch.int64).view((1, *shape[1:]))
    per_sample = _fmix32(_mul32(sample, 0x9E3779B9) ^ k0)  # (B, 1, ...)
    per_element = _fmix32(element ^ k1)  # (1, ...): shared by every sample, mixed with each one below
    return _fmix32((per_element + per_sample) & _M32)


def _hash_dropped(x: torch.Tensor, k0: int, k1: int, offset: int, threshold: int, scale: float) -> torch.Tensor:
    """x with the elements whose word is below `threshold` zeroed and the rest times `scale`."""
    keep = hash_words(tuple(x.shape), x.device, k0, k1, offset) >= threshold
    return x * (keep.to(x.dtype) * scale)


def _apply(path: str, x: torch.Tensor, args: tuple) -> torch.Tensor:
    if is_fake(x):  # a counted step: the fused kernel's one output, no temporary
        return torch.empty_like(x)
    _used.setdefault(path, "")
    if path == "hash_triton":
        from suite.harness.kernels import dropout  # imports triton: only where the kernel runs

        return dropout.dropped(x, *args)
    return _hash_dropped(x, *args)


class _HashDropout(torch.autograd.Function):
    """Dropout by the counter hash; the backward draws the same mask again (nothing is saved for it)."""

    @staticmethod
    def forward(ctx, x, path, k0, k1, offset, threshold, scale):
        ctx.path, ctx.args = path, (k0, k1, offset, threshold, scale)
        return _apply(path, x, ctx.args)

    @staticmethod
    def backward(ctx, grad):
        # d(x * m * s)/dx = m * s: the same keyed multiply applied to the gradient, bit for bit eager's mul backward.
        return _apply(ctx.path, grad, ctx.args), None, None, None, None, None, None


@functools.cache
def _scale(p: float, dtype: torch.dtype) -> float:
    """1 / (1 - p) as `keep.to(dtype) * (1 / (1 - p))` makes it (through FP32 below double): a value of the dtype,
    so that multiplying by it rounds once on every path, eager or fused."""
    s = 1.0 / (1.0 - p)
    return s if dtype == torch.float64 else float(torch.tensor(s, dtype=torch.float32).to(dtype))


def hash_key(p: float, dtype: torch.dtype) -> tuple[int, int, int, int, float]:
    """The next dropout site's draw on a hash path: (k0, k1, sample offset, threshold, scale); advances the site
    counter as a keyed_dropout call does (the fused attention draws its site through it)."""
    key, site = _next_site()
    k0, k1 = site_words(key.seed, key.step, key.layer, site)
    return k0, k1, key.offset, min(round(p * 2**32), 2**32), _scale(p, dtype)


def keyed_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout with a keyed mask (identity when not training or p == 0)."""
    if not training or p == 0.0:
        return x
    path = path_for(x.device)
    if path == "per_sample":
        _used.setdefault("per_sample", "")
        keep = keyed_uniform(x.shape, x.device) >= p
        return x * (keep.to(x.dtype) * _scale(p, x.dtype))
    return _HashDropout.apply(x, path, *hash_key(p, x.dtype))


class KeyedDropout(torch.nn.Module):
    """Drop-in for nn.Dropout that draws its mask from the active key."""

    def __init__(self, p: float):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return keyed_dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
