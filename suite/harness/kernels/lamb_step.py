"""LAMB over many tensors at once on the GPU: three Triton launches a step, whatever the number of tensors.

The tensors are reached through int64 arrays of their addresses, cut into chunks of BLOCK elements (a chunk never
straddles two tensors):

1. `_moments`: per chunk, m <- m + (1 - b1)(g - m), v <- v b2 + (1 - b2) g^2, the update
   u = (m / (sqrt(v) / sqrt(c2) + eps)) / c1 + wd p written over the gradient (LAMB spends its gradients, as the
   host's fused kernel does), and the chunk's sums of p^2 and u^2;
2. `_trust`: per tensor, its chunks' sums added in order (deterministic, no atomics) and the trust ratio
   ||p|| / ||u|| (1 where either is 0);
3. `_apply`: per chunk, p <- p + (-lr) (u * trust).

The arithmetic is torch's foreach LAMB's (suite.harness.optim.Lamb) but for the norms' order of summation. About
40 bytes move per parameter (the foreach path about 120, in some 15 launches per layer and tensor group).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from suite.harness.device import is_fake
from suite.harness.kernels import KernelError

BLOCK = 2048


@triton.jit
def _moments(P, G, M, V, SIZE, WD, CHUNK_TENSOR, CHUNK_START, PARTIAL, b1w, b2, b2w, eps, sqrt_c2, c1,
             BLOCK: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    t = tl.load(CHUNK_TENSOR + pid)
    offs = tl.load(CHUNK_START + pid) + tl.arange(0, BLOCK)
    inside = offs < tl.load(SIZE + t)
    p_ptr = tl.load(P + t).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(G + t).to(tl.pointer_type(tl.float32))
    m_ptr = tl.load(M + t).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(V + t).to(tl.pointer_type(tl.float32))
    p = tl.load(p_ptr + offs, mask=inside, other=0.0)
    g = tl.load(g_ptr + offs, mask=inside, other=0.0)
    m = tl.load(m_ptr + offs, mask=inside, other=0.0)
    v = tl.load(v_ptr + offs, mask=inside, other=0.0)
    m = m + b1w * (g - m)
    v = v * b2 + b2w * (g * g)
    u = m / (tl.sqrt_rn(v) / sqrt_c2 + eps) / c1 + tl.load(WD + t) * p
    tl.store(m_ptr + offs, m, mask=inside)
    tl.store(v_ptr + offs, v, mask=inside)
    tl.store(g_ptr + offs, u, mask=inside)
    tl.store(PARTIAL + 2 * pid, tl.sum(p * p, 0))
    tl.store(PARTIAL + 2 * pid + 1, tl.sum(u * u, 0))


@triton.jit
def _trust(PARTIAL, FIRST_CHUNK, TRUST, CHUNKS: tl.constexpr):
    t = tl.program_id(0)
    lo = tl.load(FIRST_CHUNK + t)
    hi = tl.load(FIRST_CHUNK + t + 1)
    w2 = tl.zeros([CHUNKS], dtype=tl.float32)
    u2 = tl.zeros([CHUNKS], dtype=tl.float32)
    for start in range(lo, hi, CHUNKS):
        c = start + tl.arange(0, CHUNKS)
        w2 += tl.load(PARTIAL + 2 * c, mask=c < hi, other=0.0)
        u2 += tl.load(PARTIAL + 2 * c + 1, mask=c < hi, other=0.0)
    w = tl.sqrt_rn(tl.sum(w2, 0))
    u = tl.sqrt_rn(tl.sum(u2, 0))
    tl.store(TRUST + t, tl.where((w > 0) & (u > 0), w / u, 1.0))


@triton.jit
def _apply(P, G, SIZE, CHUNK_TENSOR, CHUNK_START, TRUST, neg_lr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(CHUNK_TENSOR + pid)
    offs = tl.load(CHUNK_START + pid) + tl.arange(0, BLOCK)
    inside = offs < tl.load(SIZE + t)
    p_ptr = tl.load(P + t).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(G + t).to(tl.pointer_type(tl.float32))
    p = tl.load(p_ptr + offs, mask=inside)
    u = tl.load(g_ptr + offs, mask=inside)
    tl.store(p_ptr + offs, p + neg_lr * (u * tl.load(TRUST + t)), mask=inside)


class Layout:
    """The chunk tables of one list of tensor sizes and weight decays, on their device (made once: the sizes of a
    model's parameters do not change; their gradients' addresses do, and are sent each step)."""

    def __init__(self, sizes: list[int], weight_decay: list[float], device: torch.device):
        chunks = torch.tensor([triton.cdiv(n, BLOCK) for n in sizes], dtype=torch.int64)
        first = torch.cat([torch.zeros(1, dtype=torch.int64), chunks.cumsum(0)])
        self.n_chunks, self.n_tensors = int(first[-1]), len(sizes)
        tensor_of = torch.repeat_interleave(torch.arange(len(sizes)), chunks)
        self.size = torch.tensor(sizes, dtype=torch.int64).to(device)
        self.wd = torch.tensor(weight_decay, dtype=torch.float32).to(device)
        self.first = first.to(torch.int32).to(device)
        self.chunk_tensor = tensor_of.to(torch.int32).to(device)
        self.chunk_start = ((torch.arange(self.n_chunks) - first[tensor_of]) * BLOCK).to(device)
        self.partial = torch.empty(2 * max(self.n_chunks, 1), dtype=torch.float32, device=device)
        self.trust = torch.empty(max(self.n_tensors, 1), dtype=torch.float32, device=device)


def check(tensors: list[torch.Tensor]) -> str:
    """Why these tensors cannot take the kernel ('' where they can): FP32, contiguous, one device."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        return f"tensors on {len(devices)} devices"
    if any(t.dtype != torch.float32 for t in tensors):
        return "a tensor that is not FP32"
    if any(not t.is_contiguous() for t in tensors):
        return "a tensor that is not contiguous"
    return ""


def step(layouts: dict, params, grads, exp_avg, exp_avg_sq, weight_decay, lr, b1, b2, eps, c1, c2) -> None:
    """One LAMB step of every tensor in three launches; `layouts` keeps the chunk tables of each list of sizes."""
    if not params:
        return
    device = params[0].device
    if is_fake(params[0]):  # a counted step: the kernels' only allocations are the chunk sums and trust ratios
        n = sum(triton.cdiv(p.numel(), BLOCK) for p in params)
        torch.empty(2 * n, dtype=torch.float32, device=device)
        torch.empty(len(params), dtype=torch.float32, device=device)
        return
    sizes, decay = tuple(p.numel() for p in params), tuple(float(w) for w in weight_decay)
    layout = layouts.get((sizes, decay))
    if layout is None:
        layout = layouts[(sizes, decay)] = Layout(list(sizes), list(decay), device)
    if layout.n_chunks == 0:
        return
    addresses = [[t.data_ptr() for t in ts] for ts in (params, grads, exp_avg, exp_avg_sq)]
    table = torch.tensor(addresses, dtype=torch.int64)
    p, g, m, v = (table.pin_memory() if device.type == "cuda" else table).to(device, non_blocking=True)
    try:
        _moments[(layout.n_chunks,)](
            p, g, m, v, layout.size, layout.wd, layout.chunk_tensor, layout.chunk_start, layout.partial,
            1 - b1, b2, 1 - b2, eps, c2**0.5, c1, BLOCK=BLOCK, num_warps=8,
        )  # fmt: skip
        _trust[(layout.n_tensors,)](layout.partial, layout.first, layout.trust, CHUNKS=256)
        _apply[(layout.n_chunks,)](
            p, g, layout.size, layout.chunk_tensor, layout.chunk_start, layout.trust, -lr, BLOCK=BLOCK, num_warps=8
        )
    except Exception as exc:  # noqa: BLE001 — the cell records the kernel that failed; nothing falls back
        raise KernelError("device_lamb", exc) from exc
