"""The rates a decoder step's roofline stands on (methods/roofline.py), measured on this machine at a Llama block's
shapes (Llama 3 8B's at `paper`): the device's bf16 matmuls and attention, pinned host memory to the device and
back (each way alone and both at once, a block's 16-bit weights a copy), the host memory's triad, and L2L's host
update as the param server runs it (AdamW a window at a time from a 16-bit gradient, the 16-bit copy refreshed).
Each figure is the median of interleaved rounds, with their min and max. On a machine without CUDA only the host's
figures are measured."""

from __future__ import annotations

import statistics
import time

import torch

from experiments.benchmarks.common import benchmark, defaults
from suite.core.experiment import Row
from suite.core.registry import Option
from suite.measure.flops import peak_tflops

SETTINGS = {
    "rounds": Option(5, help="interleaved rounds, each timing every figure once"),
    "tokens": Option(4096, help="tokens of the matmuls' activations (a micro-batch of one sequence)"),
}
PRESETS = {"tiny": "llama-tiny", "small": "llama-1b", "paper": "llama-8b"}


def _time(fn, sync) -> float:
    fn()  # warm: cuBLAS's heuristics, the allocator's blocks
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def block_shapes(m) -> list[tuple[int, int]]:
    """(out, in) of a Llama block's projections: q, k, v, o, gate, up, down."""
    h, i, kv = m.hidden, m.intermediate, (m.kv_heads or m.heads) * (m.hidden // m.heads)
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]


def _block_matmuls(m, tokens: int, device) -> tuple[callable, float]:
    """One block's forward and backward matmuls at bf16 (each forward x @ W^T, and its two backward products), and
    their FLOPs."""
    shapes = block_shapes(m)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    ws = [torch.randn(o, n, device=device, dtype=dt) * 0.02 for o, n in shapes]
    xs = [torch.randn(tokens, n, device=device, dtype=dt) for _, n in shapes]
    gs = [torch.randn(tokens, o, device=device, dtype=dt) for o, _ in shapes]

    def run():
        for w, x, g in zip(ws, xs, gs):
            x @ w.t()  # forward
            g @ w  # the input's gradient
            g.t() @ x  # the weight's

    return run, sum(3 * 2 * tokens * o * n for o, n in shapes)


def _attention(m, tokens: int, device) -> tuple[callable, float]:
    """Causal SDPA over one sequence, forward and backward, and its FLOPs as suite.measure.flops counts them (every
    query against every key)."""
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    d = m.hidden // m.heads
    q, k, v = (torch.randn(1, m.heads, tokens, d, device=device, dtype=dt, requires_grad=True) for _ in range(3))

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))

    return run, 3 * 4 * tokens**2 * m.hidden


def _copies(numel: int, device) -> dict[str, callable]:
    """A block's 16-bit weights up, its gradient down, and both at once on two streams, from pinned host memory at
    its own size (as the relay's buffers are)."""
    from methods.l2l.lanes import host_buffer

    up_src = host_buffer(numel, torch.bfloat16, pin=True, zero=True)
    down_dst = host_buffer(numel, torch.bfloat16, pin=True)
    dev_a = torch.zeros(numel, device=device, dtype=torch.bfloat16)
    dev_b = torch.zeros(numel, device=device, dtype=torch.bfloat16)
    s_up, s_down = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def both():
        with torch.cuda.stream(s_up):
            dev_a.copy_(up_src, non_blocking=True)
        with torch.cuda.stream(s_down):
            down_dst.copy_(dev_b, non_blocking=True)
        s_up.synchronize()
        s_down.synchronize()

    return {
        "h2d": lambda: dev_a.copy_(up_src, non_blocking=True),
        "d2h": lambda: down_dst.copy_(dev_b, non_blocking=True),
        "both": both,
    }


def _triad(numel: int) -> callable:
    """c = a + s*b over `numel` floats, its tensors made once: the bandwidth an update streams at, at best."""
    a, b, c = torch.rand(numel), torch.rand(numel), torch.empty(numel)
    return lambda: torch.add(a, b, alpha=0.5, out=c)


def _host_update(numel: int) -> callable:
    """L2L's host update of one layer of `numel` parameters as the param server runs it where each 16-bit gradient
    is applied as it lands: AdamW a window at a time, the 16-bit copy refreshed (param_server.step_windows)."""
    from methods.l2l.param_server import WINDOW, cut_windows, step_windows
    from suite.harness.optim import LayerwiseOptimizer

    class _Run:  # what LayerwiseOptimizer reads of a run
        optimizer, lr, beta1, beta2, eps, weight_decay = "adamw", 1e-4, 0.9, 0.95, 1e-8, 0.1
        schedule, warmup_steps, total_steps = "constant", 0, 1

    p = torch.nn.Parameter(torch.randn(numel) * 0.02)
    grad, wire, scratch = torch.randn(numel).bfloat16(), torch.empty(numel, dtype=torch.bfloat16), torch.empty(WINDOW)
    opt = LayerwiseOptimizer([[("weight", p)]], _Run(), host=True)
    windows = cut_windows([p], WINDOW)

    return lambda: step_windows(opt, 0, 0, windows, grad, p.detach(), wire, scratch)


def link_cell(run, device, cap) -> dict:
    """Every figure once a round, in `rounds` interleaved rounds, in this one process."""
    m = run.model.resolved()
    tokens = run.options["tokens"]
    block = sum(o * n for o, n in block_shapes(m))  # a block's matmul weights (elements)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    gemm, gemm_flops = _block_matmuls(m, tokens, device)
    attention, attention_flops = _attention(m, tokens, device)
    work = {"gemm": gemm, "attention": attention}
    if cuda:
        work.update(_copies(block, device))
    host = {"triad": _triad(block), "host_update": _host_update(block)}
    times: dict[str, list[float]] = {k: [] for k in [*work, *host]}
    for _ in range(run.options["rounds"]):
        for k, fn in work.items():
            times[k].append(_time(fn, sync))
        for k, fn in host.items():
            times[k].append(_time(fn, lambda: None))
    # What each figure moved or computed, and its rate's unit
    per = {
        "gemm": (gemm_flops / 1e12, "tflops"),
        "attention": (attention_flops / 1e12, "tflops"),
        "h2d": (block * 2 / 1e9, "gbps"),
        "d2h": (block * 2 / 1e9, "gbps"),
        "both": (2 * block * 2 / 1e9, "gbps"),
        "triad": (block * 16 / 1e9, "gbps"),
    }
    out: dict = {"block_params": block, "tokens": tokens, "threads": torch.get_num_threads()}
    for k, ts in times.items():
        med, lo, hi = statistics.median(ts), min(ts), max(ts)
        if k == "host_update":
            out.update(host_ns_per_param=med / block * 1e9, host_ns_min=lo / block * 1e9, host_ns_max=hi / block * 1e9)
            continue
        amount, unit = per[k]
        out.update({f"{k}_{unit}": amount / med, f"{k}_{unit}_min": amount / hi, f"{k}_{unit}_max": amount / lo})
    if cuda:
        peak = peak_tflops(torch.cuda.get_device_name(device), "bf16")
        out["gemm_of_peak"] = out["gemm_tflops"] / peak if peak else None
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def rows(profile: str) -> list[Row]:
    return [Row("block", "l2l-cmp", {}, labels={})]


def base(profile: str) -> dict:
    tiny = {"rounds": 2, "tokens": 64} if profile == "tiny" else {}
    return {**defaults(SETTINGS), "model.preset": PRESETS.get(profile, "llama-8b"), "precision": "bf16", **tiny}


EXPERIMENT = benchmark(
    "bench-link",
    "The roofline's rates: matmuls, attention, PCIe each way and both, host memory, L2L's host update (measured)",
    "methods/roofline.py's inputs, at a Llama block's shapes (issue 54, item 6)",
    [
        ("gemm_tflops", "block matmuls TFLOPS", "{:.0f}"),
        ("gemm_of_peak", "of dense peak", "{:.0%}"),
        ("attention_tflops", "attention TFLOPS", "{:.0f}"),
        ("h2d_gbps", "H2D GB/s", "{:.1f}"),
        ("d2h_gbps", "D2H GB/s", "{:.1f}"),
        ("both_gbps", "both ways GB/s", "{:.1f}"),
        ("triad_gbps", "host triad GB/s", "{:.1f}"),
        ("host_ns_per_param", "host AdamW ns/param", "{:.3f}"),
    ],
    rows=rows,
    base=base,
    settings=SETTINGS,
    notes=(
        "Measured, medians of interleaved rounds (each figure timed once a round after one warm-up call; min..max "
        "in the record). Matmuls: a Llama block's seven projections (q, k, v, o, gate, up, down) at bf16 on one "
        "sequence of `tokens`, each forward and its two backward products, in the FLOPs suite.measure.flops "
        "counts; attention: causal SDPA forward and backward, counted as every query against every key (as MFU "
        "is), so a kernel that skips the masked half reads up to twice its own rate. PCIe: a block's 16-bit "
        "weights from pinned host memory at its own size, up, down, and both at once on two streams (GB/s of both "
        "together). Host: the triad c = a + s*b over a block's floats (16 bytes an element, write-allocate "
        "counted), and L2L's host update of one block as the param server runs it (AdamW a 4 MiB window at a time "
        "from a 16-bit gradient, the 16-bit copy refreshed), at every usable core. On a CPU the matmuls and "
        "attention run in FP32 on the host, and there is no PCIe. `make bench-link` runs it; the roofline takes a "
        "lent GPU's figures from its record."
    ),
)
