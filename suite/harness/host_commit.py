"""L2L-CMP's one-pass host commit (csrc/adamw_cmp.cpp): the native kernel where it builds and gives torch's bits on
this machine, and the size of the team that runs it.

The kernel reproduces torch's fused CPU AdamW operation by operation, including the one product torch's compiler
fuses; a torch built by another compiler could fuse another. So before its first use in a process the kernel steps
a probe beside torch's own fused AdamW (widened gradient in, rounded copy out) and is used only where every bit
agrees; elsewhere the param server keeps its windowed path (a widening copy, torch's fused AdamW and a rounding copy
a window at a time), and the record says why (status())."""

from __future__ import annotations

import functools
import os

import torch

from suite.harness import fused_lamb
from suite.harness.adamw import fused_adamw

UNIT = 16  # torch's fused AdamW runs its vector loop over whole units of 16 elements; the rest is the tensor's tail
_asked = [False]


def reset() -> None:
    """Forget that the kernel was asked for: each cell records only its own."""
    _asked[0] = False


def status() -> str | None:
    """What L2L-CMP's host commit ran with, for the record: 'one-pass', or 'windowed (why)'; None where no commit
    asked since the last reset()."""
    if not _asked[0]:
        return None
    why = _unusable()
    return "one-pass" if why is None else f"windowed ({why})"


def kernel():
    """The compiled module (`adamw_cmp_step`) where it gives torch's bits here, else None (the windowed path)."""
    _asked[0] = True
    return None if _unusable() else fused_lamb.compiled()


@functools.cache
def _unusable() -> str | None:
    """Why the one-pass kernel is not used in this process (None: it is)."""
    if os.environ.get("SUITE_HOST_COMMIT", "1") == "0":
        return "SUITE_HOST_COMMIT=0"
    module = fused_lamb.compiled()
    if module is None:
        return "native kernels unavailable"
    try:
        same = probe(module)
    except Exception as exc:  # noqa: BLE001 — a kernel that fails its probe is not used; the record says why
        return f"its probe failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
    return None if same else "its bits differ from torch's fused AdamW on this machine"


def probe(module, steps: int = 3) -> bool:
    """Whether `module` steps tensors of several sizes (whole units, a tail, less than a unit) as torch's fused AdamW
    does from widened bf16 gradients (times a clipping coefficient from the second step), with the rounded copies,
    bit for bit, for `steps` steps. NaNs are left out: torch's own NaN bits depend on where an element falls."""
    gen = torch.Generator().manual_seed(0)
    sizes = (3 * 4096 + 5, 40, 7)
    ours = [torch.empty(n).normal_(0, 0.02, generator=gen) for n in sizes]
    theirs = [p.clone() for p in ours]
    state = {id(p): [torch.zeros_like(p), torch.zeros_like(p)] for p in [*ours, *theirs]}
    copies = [torch.empty(n, dtype=torch.bfloat16) for n in sizes]
    decays = [0.1, 0.0, 0.1]
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)
    for k in range(1, steps + 1):
        grads = [torch.empty(n).normal_(0, 1e-3, generator=gen).to(torch.bfloat16) for n in sizes]
        step = torch.tensor(float(k))
        mul = torch.tensor(1.0 if k == 1 else 0.37, dtype=torch.float32)
        for p, g, wd in zip(theirs, grads, decays):
            m, v = state[id(p)]
            fused_adamw([p], [g.float() * mul], [m], [v], [step], weight_decay=wd, **hyper)
        step_16bit(
            module,
            ours,
            grads,
            [state[id(p)][0] for p in ours],
            [state[id(p)][1] for p in ours],
            copies,
            decays,
            step=step,
            grad_mul=float(mul),
            threads=2,
            **hyper,
        )
        same = [torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ours, theirs)]
        same += [
            torch.equal(c.view(torch.int16), p.to(torch.bfloat16).view(torch.int16)) for c, p in zip(copies, theirs)
        ]
        same += [
            torch.equal(state[id(a)][i].view(torch.int32), state[id(b)][i].view(torch.int32))
            for a, b in zip(ours, theirs)
            for i in (0, 1)
        ]
        if not all(same):
            return False
    return True


@torch.no_grad()
def step_16bit(
    module, params, grads, exp_avgs, exp_avg_sqs, copies, decays, *, lr, beta1, beta2, eps, step, grad_mul, threads
) -> None:
    """One AdamW step of FP32 `params` (their moments `exp_avgs`, `exp_avg_sqs`; each its weight decay) from bf16
    `grads` times `grad_mul`, writing their bf16 `copies`: each tensor's whole units through the one-pass kernel with
    `threads` threads, its tail (under UNIT elements) through torch's fused AdamW and a rounding copy, as torch's
    own kernel computes a tail apart. `step`: the step count (a 0-d tensor, already advanced)."""
    module.adamw_cmp_step(
        params, grads, exp_avgs, exp_avg_sqs, copies, decays, lr, beta1, beta2, eps, float(step), grad_mul, threads
    )
    tails = [i for i, p in enumerate(params) if p.numel() % UNIT]
    for i in tails:
        lo = params[i].numel() - params[i].numel() % UNIT
        p = params[i].view(-1)[lo:]
        g = grads[i].view(-1)[lo:].float()
        if grad_mul != 1.0:
            g.mul_(torch.tensor(grad_mul, dtype=torch.float32))
        fused_adamw(
            [p], [g], [exp_avgs[i].view(-1)[lo:]], [exp_avg_sqs[i].view(-1)[lo:]], [step],
            lr=lr, beta1=beta1, beta2=beta2, weight_decay=decays[i], eps=eps,
        )  # fmt: skip
        copies[i].view(-1)[lo:].copy_(p)


def team(device_type: str) -> int:
    """Threads of the one-pass commit, from the machine: on a GPU's host every usable core but two, which it leaves
    to the thread that launches the device's work and to the host thread that waits for landings and queues
    commits; on a CPU run (the device's compute is the host's as well) torch's thread count."""
    return torch.get_num_threads() if device_type == "cpu" else max(1, _usable_cores() - 2)


@functools.cache
def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
