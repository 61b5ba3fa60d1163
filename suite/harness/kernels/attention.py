"""Attention with keyed dropout inside it: a flash-style Triton kernel, forward and backward.

softmax(q k^T * scale + mask) is never materialised: each program walks the keys in tiles with an online softmax
in FP32, applies the keyed dropout to the probabilities of each tile as it goes, and accumulates P V in FP32. The
dropout's bits are those of rng.keyed_dropout over the (B, H, Sq, Sk) probabilities: element (h, i, j) of sample b
is numbered (h * Sq + i) * Sk + j and keyed by (site, offset + b), so a fused row draws what the materialised
attention drew. The backward regenerates the same bits from the same numbers (FlashAttention-2's two passes: keys
and values, then queries), after a third that takes delta = rowsum(P * dP) in FP32 from the same tiles (not
rowsum(dO * O) over the 16-bit O: _backward_q says why). Saved for the backward: q, k, v and two FP32 numbers per
query row (the row's maximum score and its sum). Grouped-query attention (Llama's 8 key/value heads for 32 query
heads) reads each group's key and value head in place, never a repeated copy; its dK and dV sum the group in one
program. Every base address is 64-bit (_at).

The mask is boolean, True = attend, broadcastable to (B, H, Sq, Sk): BERT's key padding (B, 1, 1, Sk) and GPT-2's
causal-and-padding (B, 1, Sq, Sk) alike; `causal` masks the later keys without a mask tensor (a decoder's batch
with no padding). A masked score is -1e30 (in base 2): a row with every key masked gets a
uniform distribution and no score gradient, as the materialised path's masked_fill and softmax give it. FP32
inputs multiply in IEEE FP32 (no TF32), 16-bit ones on tensor cores with FP32 accumulation.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from suite.harness.device import is_fake
from suite.harness.kernels import KernelError, fused_attention_takes, interpreted
from suite.harness.kernels.dropout import KEY_ARGS, as_i32, kept, sample_word

LOG2E = 1.4426950408889634
MASKED = -1.0e30  # a masked score in base 2: far below any real one, finite so that a fully masked row stays defined


@triton.jit
def _at(b, h, sb, sh):
    """The offset of sample b, head h: in 64 bits, as every base address of the kernels is (b * sb passes 2**31 once a
    tensor has that many elements: Llama 3 8B's q at sequence 8192 and micro-batch 64)."""
    return b.to(tl.int64) * sb + h.to(tl.int64) * sh


@triton.jit
def _scores(
    q, k, mask_ptr, offs_m, offs_n, SQ, SK, smh, smm, smn, qk_scale,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Base-2 scores of a (BLOCK_M, BLOCK_N) tile (k given transposed, (D, BLOCK_N)); masked ones at MASKED,
    columns past the keys at -inf; and the tile's attend mask (all True without a mask). CAUSAL: query i attends
    the keys up to i + SK - SQ (the last query sees every key), as a decoder without a mask is run."""
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    attend = (offs_m[:, None] < SQ) & (offs_n[None, :] < SK)
    if CAUSAL:
        attend = attend & (offs_n[None, :] <= offs_m[:, None] + (SK - SQ))
    if HAS_MASK:
        m = tl.load(mask_ptr + offs_m[:, None] * smm + offs_n[None, :] * smn, mask=attend, other=1)
        attend = attend & (m != 0)
    if HAS_MASK or CAUSAL:
        s = tl.where(attend, s, -1.0e30)
    s = tl.where(offs_n[None, :] < SK, s, float("-inf"))
    return s, attend


@triton.jit
def _keep(sw, h, offs_m, offs_n, SQ, SK, k1, threshold):
    """The keyed dropout's verdict for each element of a tile: element (h, i, j) of the sample's probabilities."""
    rows = (h * SQ + offs_m).to(tl.int64) * SK
    element = (rows[:, None] + offs_n[None, :]).to(tl.uint32)
    return kept(sw, element, k1, threshold)


@triton.jit
def _keys_to(pid, SQ, SK, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """Where a query tile's walk over the keys may stop: under CAUSAL, past the last key its last query attends
    (the tiles beyond are wholly masked, so they add exact zeros: the same bits, half the work at SQ = SK); every key
    where a query may attend none (SK < SQ: such a row's uniform distribution needs every key)."""
    end = SK
    if CAUSAL:
        if SK >= SQ:
            end = tl.minimum(SK, (pid + 1) * BLOCK_M + SK - SQ)
    return end


@triton.jit
def _queries_from(pid, SQ, SK, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Where a key tile's walk over the queries may start: under CAUSAL, at the query tile of the first query that
    attends its first key (the tiles before see none of its keys: exact zeros), aligned to the tiles a full walk
    takes, so the sums run in the same order; from the first query where a query may attend no key (SK < SQ)."""
    start = 0
    if CAUSAL:
        if SK >= SQ:
            start = (tl.maximum(pid * BLOCK_N - (SK - SQ), 0) // BLOCK_M) * BLOCK_M
    return start


@triton.jit(do_not_specialize=KEY_ARGS)
def _forward(Q, K, V, OUT, ROWMAX, ROWSUM, MASK,
             sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
             smb, smh, smm, smn,
             H, GROUP, SQ, SK, D, qk_scale, k0, k1, offset, threshold, dscale,
             HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n0 = tl.arange(0, BLOCK_N)
    in_d = offs_d < D
    q = tl.load(Q + _at(b, h, sqb, sqh) + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                mask=(offs_m[:, None] < SQ) & in_d[None, :], other=0.0)  # fmt: skip
    k_base = K + _at(b, h // GROUP, skb, skh)  # a grouped query head reads its group's key and value head
    v_base = V + _at(b, h // GROUP, svb, svh)
    mask_ptr = MASK + _at(b, h, smb, smh)
    sw = sample_word((b + offset).to(tl.uint32), k0)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, _keys_to(pid, SQ, SK, CAUSAL, BLOCK_M), BLOCK_N):
        offs_n = start + offs_n0
        in_n = offs_n < SK
        k = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=in_n[None, :] & in_d[:, None],
                    other=0.0)  # fmt: skip
        s, attend = _scores(
            q, k, mask_ptr, offs_m, offs_n, SQ, SK, smh, smm, smn, qk_scale, HAS_MASK, CAUSAL, PRECISION
        )
        new_max = tl.maximum(row_max, tl.max(s, 1))
        p = tl.exp2(s - new_max[:, None])
        alpha = tl.exp2(row_max - new_max)
        row_sum = row_sum * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = _keep(sw, h, offs_m, offs_n, SQ, SK, k1, threshold)
            p = tl.where(keep, p * dscale, 0.0)
        v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=in_n[:, None] & in_d[None, :],
                    other=0.0)  # fmt: skip
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        row_max = new_max
    acc = acc / row_sum[:, None]
    in_m = offs_m < SQ
    tl.store(OUT + _at(b, h, sob, soh) + offs_m[:, None] * som + offs_d[None, :] * sod,
             acc.to(OUT.dtype.element_ty), mask=in_m[:, None] & in_d[None, :])  # fmt: skip
    tl.store(ROWMAX + bh.to(tl.int64) * SQ + offs_m, row_max, mask=in_m)
    tl.store(ROWSUM + bh.to(tl.int64) * SQ + offs_m, row_sum, mask=in_m)


@triton.jit
def _probs(s, attend, ROWMAX, ROWSUM, bh, offs_m, SQ):
    """The softmax probabilities of a tile again, from the forward's row maxima and sums."""
    in_m = offs_m < SQ
    row_max = tl.load(ROWMAX + bh.to(tl.int64) * SQ + offs_m, mask=in_m, other=0.0)
    row_sum = tl.load(ROWSUM + bh.to(tl.int64) * SQ + offs_m, mask=in_m, other=1.0)
    p = tl.exp2(s - row_max[:, None]) / row_sum[:, None]
    return tl.where((offs_m[:, None] < SQ) & (s > float("-inf")), p, 0.0)


@triton.jit(do_not_specialize=KEY_ARGS)
def _backward_kv(Q, K, V, DO, DK, DV, ROWMAX, ROWSUM, DELTA, MASK,
                 sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                 smb, smh, smm, smn,
                 H, GROUP, SQ, SK, D, qk_scale, sm_scale, k0, k1, offset, threshold, dscale,
                 HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """dK and dV of one tile of keys of one key/value head, walking every query tile of each query head of its group
    (one program sums the group: no two programs write one gradient). DK, DV share K's and V's strides."""
    pid = tl.program_id(0)
    bg = tl.program_id(1)
    HK = H // GROUP
    b = bg // HK
    g = bg % HK
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_m0 = tl.arange(0, BLOCK_M)
    in_d = offs_d < D
    in_n = offs_n < SK
    kv_mask = in_n[:, None] & in_d[None, :]
    k_ptrs = _at(b, g, skb, skh) + offs_n[:, None] * skn + offs_d[None, :] * skd
    v_ptrs = _at(b, g, svb, svh) + offs_n[:, None] * svn + offs_d[None, :] * svd
    k = tl.load(K + k_ptrs, mask=kv_mask, other=0.0)
    v = tl.load(V + v_ptrs, mask=kv_mask, other=0.0)
    kt = tl.trans(k)
    vt = tl.trans(v)
    sw = sample_word((b + offset).to(tl.uint32), k0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for j in range(0, GROUP):
        h = g * GROUP + j
        bh = b * H + h
        mask_ptr = MASK + _at(b, h, smb, smh)
        for start in range(_queries_from(pid, SQ, SK, CAUSAL, BLOCK_M, BLOCK_N), SQ, BLOCK_M):
            offs_m = start + offs_m0
            in_m = offs_m < SQ
            q = tl.load(Q + _at(b, h, sqb, sqh) + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                        mask=in_m[:, None] & in_d[None, :], other=0.0)  # fmt: skip
            do = tl.load(DO + _at(b, h, sob, soh) + offs_m[:, None] * som + offs_d[None, :] * sod,
                         mask=in_m[:, None] & in_d[None, :], other=0.0)  # fmt: skip
            delta = tl.load(DELTA + bh.to(tl.int64) * SQ + offs_m, mask=in_m, other=0.0)
            s, attend = _scores(
                q, kt, mask_ptr, offs_m, offs_n, SQ, SK, smh, smm, smn, qk_scale, HAS_MASK, CAUSAL, PRECISION
            )
            p = _probs(s, attend, ROWMAX, ROWSUM, bh, offs_m, SQ)
            dp = tl.dot(do, vt, input_precision=PRECISION)
            if DROPOUT:
                keep = _keep(sw, h, offs_m, offs_n, SQ, SK, k1, threshold)
                pd = tl.where(keep, p * dscale, 0.0)
                dp = tl.where(keep, dp * dscale, 0.0)
            else:
                pd = p
            dv += tl.dot(tl.trans(pd.to(do.dtype)), do, input_precision=PRECISION)
            ds = tl.where(attend, p * (dp - delta[:, None]), 0.0)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(DK + k_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + v_ptrs, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit(do_not_specialize=KEY_ARGS)
def _backward_q(Q, K, V, DO, DQ, ROWMAX, ROWSUM, DELTA, MASK,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                smb, smh, smm, smn,
                H, GROUP, SQ, SK, D, qk_scale, sm_scale, k0, k1, offset, threshold, dscale,
                HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
                DELTA_PASS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """dQ of one tile of queries, walking every key tile (DQ shares Q's strides). With DELTA_PASS, the backward's
    first pass instead: delta = rowsum(P * dP) in FP32, from the same probabilities and dP as the gradient passes, so
    that a row's score gradient P (dP - delta) sums to zero as the materialised softmax's does. (rowsum(dO * O) is
    the same sum, but over O rounded to 16 bits: a padded sample that keeps one key then got dK 10x further from its
    FP32 value than the materialised attention's.)"""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n0 = tl.arange(0, BLOCK_N)
    in_d = offs_d < D
    in_m = offs_m < SQ
    q_ptrs = _at(b, h, sqb, sqh) + offs_m[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(Q + q_ptrs, mask=in_m[:, None] & in_d[None, :], other=0.0)
    do = tl.load(DO + _at(b, h, sob, soh) + offs_m[:, None] * som + offs_d[None, :] * sod,
                 mask=in_m[:, None] & in_d[None, :], other=0.0)  # fmt: skip
    if DELTA_PASS:
        delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    else:
        delta = tl.load(DELTA + bh.to(tl.int64) * SQ + offs_m, mask=in_m, other=0.0)
    k_base = K + _at(b, h // GROUP, skb, skh)
    v_base = V + _at(b, h // GROUP, svb, svh)
    mask_ptr = MASK + _at(b, h, smb, smh)
    sw = sample_word((b + offset).to(tl.uint32), k0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, _keys_to(pid, SQ, SK, CAUSAL, BLOCK_M), BLOCK_N):
        offs_n = start + offs_n0
        in_n = offs_n < SK
        kt = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=in_n[None, :] & in_d[:, None],
                     other=0.0)  # fmt: skip
        vt = tl.load(v_base + offs_n[None, :] * svn + offs_d[:, None] * svd, mask=in_n[None, :] & in_d[:, None],
                     other=0.0)  # fmt: skip
        s, attend = _scores(
            q, kt, mask_ptr, offs_m, offs_n, SQ, SK, smh, smm, smn, qk_scale, HAS_MASK, CAUSAL, PRECISION
        )
        p = _probs(s, attend, ROWMAX, ROWSUM, bh, offs_m, SQ)
        dp = tl.dot(do, vt, input_precision=PRECISION)
        if DROPOUT:
            keep = _keep(sw, h, offs_m, offs_n, SQ, SK, k1, threshold)
            dp = tl.where(keep, dp * dscale, 0.0)
        if DELTA_PASS:
            delta += tl.sum(tl.where(attend, p * dp, 0.0), 1)
        else:
            ds = tl.where(attend, p * (dp - delta[:, None]), 0.0)
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PRECISION)
    if DELTA_PASS:
        tl.store(DELTA + bh.to(tl.int64) * SQ + offs_m, delta, mask=in_m)
    else:
        tl.store(DQ + q_ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=in_m[:, None] & in_d[None, :])


def _configs(pairs) -> list:
    return [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=st) for m, n, w, st in pairs]


# On a GPU the tiles are tuned once per (shape, group, mask, causal, dropout, dtype) among a few configurations, the
# timings kept in Triton's disk cache (so a fresh process of the same cell does not tune again). SUITE_TRITON_TUNE=0
# takes the first configuration of each instead (the record's harness says so). Interpreted: 16 x 16 tiles, so that
# tiny test shapes cross several of them.
FORWARD_TILES = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 32, 4, 4)]
KV_TILES = [(64, 64, 4, 2), (32, 128, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3)]
Q_TILES = [(64, 64, 4, 2), (128, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 3)]
TUNED = not interpreted() and os.environ.get("SUITE_TRITON_TUNE", "1") != "0"
# (Triton adds every tensor argument's dtype to the key; causal walks half the tiles and a group changes the work of
# a key tile: both keyed)
TUNE_KEY = ["SQ", "SK", "D", "GROUP", "HAS_MASK", "CAUSAL", "DROPOUT"]
if TUNED:
    _forward = triton.autotune(_configs(FORWARD_TILES), TUNE_KEY, cache_results=True)(_forward)
    _backward_kv = triton.autotune(_configs(KV_TILES), TUNE_KEY, cache_results=True)(_backward_kv)
    # (its delta pass and its dQ pass tuned apart: they do different work on the same tiles)
    _backward_q = triton.autotune(_configs(Q_TILES), [*TUNE_KEY, "DELTA_PASS"], cache_results=True)(_backward_q)


def tiles_note() -> str:
    """How the attention's tiles were chosen, for the record."""
    return "tuned" if TUNED else ("16 x 16 (interpreted)" if interpreted() else "fixed")


def _grid(rows: int, tile: str, bh: int, choices: list):
    """The grid over (tiles of `rows`, B * H), and the tile settings to pass: none where the tuner picks them."""
    if TUNED:
        return (lambda meta: (triton.cdiv(rows, meta[tile]), bh)), {}
    m, n, warps, stages = (16, 16, 1, 1) if interpreted() else choices[0]
    size = dict(BLOCK_M=m, BLOCK_N=n)
    return (triton.cdiv(rows, size[tile]), bh), dict(size, num_warps=warps, num_stages=stages)


def _strides4(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.stride())


class _Launch:
    """What the three kernels share: shapes, strides, the key, the mask's pointer and strides, tiles."""

    def __init__(self, q, k, v, mask, scaling, dropout, key, causal=False):
        if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
            raise ValueError(
                "keyed attention takes q (B, H, Sq, D) and k, v of one shape (B, H_kv, Sk, D), not "
                f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            )
        self.B, self.H, self.SQ, self.D = q.shape
        self.HK, self.SK = k.shape[1], k.shape[2]
        if k.shape[0] != self.B or k.shape[3] != self.D or self.HK == 0 or self.H % self.HK:
            raise ValueError(
                f"keyed attention: k and v {tuple(k.shape)} do not fit q {tuple(q.shape)}: the same batch and head "
                f"size, and key/value heads that divide the {self.H} query heads (grouped-query attention)"
            )
        self.group = self.H // self.HK
        if self.H * self.SQ * self.SK >= 2**32:
            raise ValueError(f"a sample of {self.H * self.SQ * self.SK} probabilities is past the hash's 2**32 counter")
        self.causal = bool(causal)
        self.scaling = scaling
        self.qk_scale = scaling * LOG2E
        k0, k1, self.offset, self.threshold, self.dscale = key if dropout else (0, 0, 0, 0, 1.0)
        self.k0, self.k1 = as_i32(k0), as_i32(k1)
        self.dropout = bool(dropout)
        self.has_mask = mask is not None
        if mask is None:
            self.mask, self.mask_strides = None, (0, 0, 0, 0)
        else:
            if mask.dtype != torch.bool:  # an additive float mask would read 0 (attend) as masked
                raise ValueError(f"keyed attention takes a boolean mask (True = attend), not {mask.dtype}")
            try:
                self.mask = mask.expand(self.B, self.H, self.SQ, self.SK).view(torch.uint8)
            except RuntimeError:
                raise ValueError(
                    f"keyed attention: a mask {tuple(mask.shape)} does not broadcast to (B, H, Sq, Sk) = "
                    f"{(self.B, self.H, self.SQ, self.SK)}"
                ) from None
            self.mask_strides = _strides4(self.mask)
        self.precision = "tf32"  # a 16-bit dot's inputs are exact in it (FP32 inputs are refused: keyed_attention)
        self.block_d = max(16, triton.next_power_of_2(self.D))

    def mask_arg(self, q: torch.Tensor) -> torch.Tensor:
        """The mask's tensor, or where there is none `q`, a pointer the kernels never read. Never `q` kept here: the
        launch lives on the autograd context, and a tensor held there outlives a checkpoint's drop of the saved
        tensors (a block's query projection, 67 MB a layer at Table 3's shape, kept until its backward)."""
        return q if self.mask is None else self.mask

    def scalars(self, backward: bool) -> tuple:
        head = (self.H, self.group, self.SQ, self.SK, self.D, self.qk_scale)
        tail = (self.k0, self.k1, self.offset, self.threshold, self.dscale)
        return (*head, self.scaling, *tail) if backward else (*head, *tail)

    def constants(self) -> dict:
        return dict(
            HAS_MASK=self.has_mask, CAUSAL=self.causal, DROPOUT=self.dropout, PRECISION=self.precision,
            BLOCK_D=self.block_d,
        )  # fmt: skip


def _run(name: str, kernel, grid, *args, **kwargs) -> None:
    try:
        kernel[grid](*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 — the cell records which kernel failed; nothing falls back
        raise KernelError(name, exc) from exc


def _forward_launch(q, k, v, launch: _Launch):
    B, H, SQ, D = q.shape
    out = torch.empty((B, SQ, H, D), dtype=q.dtype, device=q.device)  # the layout attention's caller wants
    o = out.permute(0, 2, 1, 3)
    row_max = torch.empty((B, H, SQ), dtype=torch.float32, device=q.device)
    row_sum = torch.empty_like(row_max)
    if is_fake(q):  # a counted step: the kernel's outputs, nothing in between
        return out, row_max, row_sum
    grid, tiles = _grid(SQ, "BLOCK_M", B * H, FORWARD_TILES)
    _run(
        "keyed_attention_forward", _forward, grid,
        q, k, v, o, row_max, row_sum, launch.mask_arg(q),
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(o), *launch.mask_strides,
        *launch.scalars(backward=False), **launch.constants(), **tiles,
    )  # fmt: skip
    return out, row_max, row_sum


def _backward_launch(q, k, v, do, row_max, row_sum, launch: _Launch):
    # The kernels write each gradient through its input's strides: lay out an input whose strides empty_like
    # would not keep (an expanded or overlapping view) densely first.
    q, k, v = (t if torch.empty_like(t).stride() == t.stride() else t.contiguous() for t in (q, k, v))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if is_fake(q):
        torch.empty_like(row_max)  # delta's bytes
        return dq, dk, dv
    B, H, SQ, D = q.shape
    delta = torch.empty_like(row_max)  # (B, H, SQ): rowsum(P * dP) in FP32 (_backward_q's DELTA_PASS)
    common = (
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do), *launch.mask_strides,
        *launch.scalars(backward=True),
    )  # fmt: skip
    grid, tiles = _grid(SQ, "BLOCK_M", B * H, Q_TILES)
    _run(
        "keyed_attention_backward_delta", _backward_q, grid,
        q, k, v, do, dq, row_max, row_sum, delta, launch.mask_arg(q), *common, **launch.constants(), **tiles,
        DELTA_PASS=True,
    )  # fmt: skip
    grid, tiles = _grid(launch.SK, "BLOCK_N", B * launch.HK, KV_TILES)  # a program per key tile of a k/v head
    _run(
        "keyed_attention_backward_kv", _backward_kv, grid,
        q, k, v, do, dk, dv, row_max, row_sum, delta, launch.mask_arg(q), *common, **launch.constants(), **tiles,
    )  # fmt: skip
    grid, tiles = _grid(SQ, "BLOCK_M", B * H, Q_TILES)
    _run(
        "keyed_attention_backward_q", _backward_q, grid,
        q, k, v, do, dq, row_max, row_sum, delta, launch.mask_arg(q), *common, **launch.constants(), **tiles,
        DELTA_PASS=False,
    )  # fmt: skip
    return dq, dk, dv


class KeyedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scaling, dropout, key, causal):
        launch = _Launch(q, k, v, mask, scaling, dropout, key, causal)
        out, row_max, row_sum = _forward_launch(q, k, v, launch)
        ctx.launch = launch
        ctx.save_for_backward(q, k, v, row_max, row_sum)  # not O: the backward's delta is taken from P and dP
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, row_max, row_sum = ctx.saved_tensors
        do = grad.permute(0, 2, 1, 3)
        dq, dk, dv = _backward_launch(q, k, v, do, row_max, row_sum, ctx.launch)
        return dq, dk, dv, None, None, None, None, None


def keyed_attention(
    q, k, v, mask, scaling: float, dropout: float, key: tuple | None, causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T * scaling, masked) with keyed dropout, times v: q (B, H, S, D) in, (B, S, H, D) out; k and v
    (B, H_kv, S, D) with H_kv dividing H (grouped-query attention: query head h reads key/value head h // (H / H_kv),
    never a repeated copy). `causal`: each query attends the keys up to its own position (with or beside `mask`).

    `key` is (k0, k1, sample offset, threshold, scale) as rng.keyed_dropout would draw them for the (B, H, Sq, Sk)
    probabilities (None, with dropout 0, for none). q, k and v share one 16-bit dtype (the caller casts); FP32
    takes the materialised attention (suite/harness/model.py: Triton's FP32 dot has no tensor-core path)."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"keyed attention takes q, k, v of one dtype, not {q.dtype}, {k.dtype}, {v.dtype}")
    if not fused_attention_takes(q.dtype):
        raise ValueError(f"the fused keyed attention takes fp16 or bf16, not {q.dtype} (FP32: the materialised one)")
    if not math.isfinite(scaling):
        raise ValueError(f"attention scaling {scaling} is not finite")
    return KeyedAttention.apply(q, k, v, mask, float(scaling), dropout, key, bool(causal))
