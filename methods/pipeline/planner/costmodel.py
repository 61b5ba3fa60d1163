"""Per-layer time and memory profiles for the planner: measured on this machine (cached) or derived from FLOPs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Bytes per parameter besides the weight copies: an FP32 gradient and the two moments of LAMB/AdamW.
GRAD_AND_STATE_BYTES = 4 + 8


@dataclass
class LayerCost:
    """One layer of the layered view. Times are seconds, linear in the micro-batch size b: a + slope * b."""

    name: str
    params: int
    forward: tuple[float, float]  # (a, slope)
    backward: tuple[float, float]
    keep_bytes: float  # per sample: what a forward with autograd keeps until its backward
    out_bytes: float  # per sample: the layer's output (sent on; stashed under recompute)
    work_bytes: float = 0.0  # per sample: transient peak of the backward over what was kept

    def fwd(self, b: int) -> float:
        return max(self.forward[0] + self.forward[1] * b, 0.0)

    def bwd(self, b: int) -> float:
        return max(self.backward[0] + self.backward[1] * b, 0.0)


@dataclass
class Link:
    """A point-to-point or all-reduce link: seconds = latency + bytes / bandwidth."""

    latency: float = 0.0
    bandwidth: float = float("inf")  # bytes per second

    def seconds(self, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else self.latency + nbytes / self.bandwidth


@dataclass
class Profile:
    """Costs of every layer (embed, blocks, head) of one model at one sequence length on one device."""

    source: str  # "measured: <device, threads>" or "analytic: <device spec>"
    seq_len: int
    layers: list[LayerCost]
    weight_bytes_per_param: int = 4  # each weight version (FP32 here; 2 for FP16 copies beside FP32 masters)
    state_bytes_per_param: int = GRAD_AND_STATE_BYTES
    optimizer_s_per_param: float = 0.0
    optimizer_temp_bytes_per_param: float = 8.0  # transient of one layer's optimizer step (LAMB: two FP32 temporaries)
    all_reduce_buffer_bytes_per_param: float = (
        4.0  # ours flattens a stage's FP32 gradients for the replicas' all-reduce
    )
    # gloo's isend reports completion only when waited on, so our executor holds each step's sent tensors until
    # the step ends (NCCL sends are waited at once): m boundary tensors per direction a stage sends.
    holds_sends: bool = True
    p2p: Link = field(default_factory=Link)
    all_reduce: Link = field(default_factory=Link)
    memory: float | None = None  # bytes per device, when the source states one

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Profile":
        d = dict(d)
        d["layers"] = [
            LayerCost(**{**c, "forward": tuple(c["forward"]), "backward": tuple(c["backward"])}) for c in d["layers"]
        ]
        d["p2p"], d["all_reduce"] = Link(**d["p2p"]), Link(**d["all_reduce"])
        return Profile(**d)


def _median_time(fn, repeats: int, device: torch.device = torch.device("cpu")) -> float:
    from suite.harness.device import synchronize

    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class _CudaBytes:
    """The live-bytes tracker's interface (live, peak) over the CUDA allocator's counters, relative to entry."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        return False

    @property
    def live(self) -> int:
        return torch.cuda.memory_allocated(self.device) - self.base

    @property
    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) - self.base

    @peak.setter
    def peak(self, _value) -> None:  # the tracker's "peak from here": restart the allocator's peak
        torch.cuda.reset_peak_memory_stats(self.device)


def _bytes_tracker(device: torch.device):
    from suite.measure.memory import LiveBytesTracker

    return _CudaBytes(device) if device.type == "cuda" else LiveBytesTracker()


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line through (b, value); one point gives a line through the origin."""
    if len(points) == 1:
        b, v = points[0]
        return 0.0, v / b
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mv = sum(v for _, v in points) / n
    slope = sum((b - mb) * (v - mv) for b, v in points) / sum((b - mb) ** 2 for b, _ in points)
    return mv - slope * mb, slope


def _layer_pass(model, ctx, repeats: int, device: torch.device = torch.device("cpu")):
    """Per layer: median forward and backward seconds, kept/output/transient bytes (live-bytes tracker on
    CPU, the allocator's counters on CUDA)."""
    n = model.num_layers
    fwd, bwd = [0.0] * n, [0.0] * n
    keep, out_b, work = [0] * n, [0] * n, [0] * n
    # Inputs of every layer, from a no-grad pass: each layer is then timed on its own graph.
    with torch.no_grad():
        xs, x = [], ctx.mb
        for i in range(n):
            xs.append(x)
            x = model.forward_layer(i, x, ctx)
    for i in range(n):

        def inp():
            return xs[i] if i == 0 else xs[i].detach().requires_grad_(True)

        def forward():
            return model.forward_layer(i, inp(), ctx)

        fwd[i] = _median_time(forward, repeats, device)
        grad_out = None if i == n - 1 else torch.ones_like(xs[i + 1])

        def both():
            y = forward()
            torch.autograd.backward(y, grad_out)

        bwd[i] = max(_median_time(both, repeats, device) - fwd[i], 0.0)
        model.zero_grad(set_to_none=False)  # gradients exist: the tracked pass books activations only
        x_in = inp()
        with _bytes_tracker(device) as tr:
            y = model.forward_layer(i, x_in, ctx)
            keep[i] = tr.live
            out_b[i] = y.numel() * y.element_size() if i < n - 1 else 0
            before = tr.live
            tr.peak = before
            torch.autograd.backward(y, grad_out)
            work[i] = max(tr.peak - before, 0)
            del y
        model.zero_grad(set_to_none=True)
    return fwd, bwd, keep, out_b, work


def measure_profile(
    run,
    micro_batch_sizes: tuple[int, ...] = (2, 4, 8),
    repeats: int = 5,
    threads: int | None = None,
    device: torch.device | None = None,
) -> Profile:
    """Time and track every layer of `run`'s model on `device` (default CPU) at each micro-batch size; fit lines."""
    from suite.harness.data import synthetic_batch
    from suite.harness.model import build_model
    from suite.harness.optim import LayerwiseOptimizer
    from suite.measure.provenance import device_info

    device = torch.device("cpu") if device is None else device
    if threads:
        torch.set_num_threads(threads)
    model = build_model(run.model, run.seed).to(device)
    per_b = {}
    for b in micro_batch_sizes:
        mb = synthetic_batch(0, b, run.seq_len, run.model.vocab_size, run.model.num_labels, run.seed).to(device)
        ctx = model.begin(mb, run.seed, 0, b)
        _layer_pass(model, ctx, 1, device)  # warm-up: first calls pay for allocations and kernel selection
        per_b[b] = _layer_pass(model, ctx, repeats, device)
    layers = []
    for i in range(model.num_layers):
        params = sum(p.numel() for _, p in model.layer_named_parameters(i))
        pts = lambda k: [(b, per_b[b][k][i]) for b in micro_batch_sizes]  # noqa: E731
        per_sample = lambda k: _fit(pts(k))[1]  # noqa: E731  bytes grow with b; the intercept is noise
        name = "embed" if i == 0 else "head" if i == model.num_layers - 1 else f"block{i}"
        layers.append(
            LayerCost(
                name,
                params,
                _fit(pts(0)),
                _fit(pts(1)),
                max(per_sample(2), 0.0),
                max(per_sample(3), 0.0),
                max(per_sample(4), 0.0),
            )
        )
    # Optimizer: one LAMB/AdamW step over the whole model, per parameter.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    named = [model.layer_named_parameters(i) for i in range(model.num_layers)]
    opt = LayerwiseOptimizer(named, run)
    total = sum(p.numel() for p in model.parameters())
    opt_s = _median_time(lambda: [opt.step_layer(j, 0) for j in range(len(named))], repeats, device) / total
    big = max(range(len(named)), key=lambda j: sum(p.numel() for _, p in named[j]))
    with _bytes_tracker(device) as tr:
        opt.step_layer(big, 1)
    temp = tr.peak / sum(p.numel() for _, p in named[big])
    where = device_info(device).get("device", device.type) if device.type == "cuda" else "cpu"
    source = f"measured: {where}, {torch.get_num_threads()} thread(s)"
    # NCCL sends are waited at once; gloo's are held to the step's end (see Profile.holds_sends).
    return Profile(
        source,
        run.seq_len,
        layers,
        optimizer_s_per_param=opt_s,
        optimizer_temp_bytes_per_param=temp,
        holds_sends=device.type != "cuda",
    )


def profile_key(run, micro_batch_sizes, threads, device: torch.device | None = None) -> str:
    """Cache key: the model, sequence, optimizer and the measuring setup (not the batch shape)."""
    what = {
        "model": dataclasses.asdict(run.model.resolved()),
        "seq_len": run.seq_len,
        "optimizer": run.optimizer,
        "sizes": list(micro_batch_sizes),
        "threads": threads,
        "torch": torch.__version__,
        "host": os.uname().nodename,
        "version": 4,  # 4: CPU optimizers fused (no foreach temporaries, other timings)
        "device": None if device is None else str(device.type),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def cached_profile(
    run,
    cache_dir: Path,
    micro_batch_sizes=(2, 4, 8),
    threads: int | None = None,
    refresh: bool = False,
    device: torch.device | None = None,
) -> Profile:
    """measure_profile, cached per model, machine and device as JSON under `cache_dir` (seconds to minutes)."""
    key = profile_key(run, micro_batch_sizes, threads, device if device is not None and device.type == "cuda" else None)
    path = Path(cache_dir) / f"{key}.json"
    if path.exists() and not refresh:
        return Profile.from_dict(json.loads(path.read_text()))
    prof = measure_profile(run, tuple(micro_batch_sizes), threads=threads, device=device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prof.to_dict(), indent=1))
    return prof


# ---------------------------------------------------------------------------------------------------
# Analytic profiles: a transformer's FLOPs at an achieved rate, activations by the standard count.


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator and its links as the paper describes its cluster (assumptions, stated in every table)."""

    name: str
    flops: float  # achieved FLOP/s of a training step (the paper's own measured figure where it gives one)
    memory: float  # bytes per device
    intra: Link  # between devices of one server
    inter: Link  # between servers
    per_server: int = 8
    optimizer_s_per_param: float = 0.0


# The 2BW paper's cluster: p3.16xlarge servers, 8x V100-16GB with NVLink; about 45 TFLOP/s achieved on
# one worker (§5, "Implementation"). NVLink ~ 150 GB/s per direction per GPU and 25 Gbit/s between servers
# are AWS's published figures, not the paper's: projections carry that assumption in their notes.
V100_P3 = DeviceSpec(
    "V100-16GB (p3.16xlarge)",
    flops=45e12,
    memory=16e9,
    intra=Link(10e-6, 150e9),
    inter=Link(50e-6, 25e9 / 8),
    optimizer_s_per_param=1e-11,
)
DEVICE_SPECS = {"v100": V100_P3}


# Kernel efficiency grows with the tokens in a micro-batch: eff(b) ~ b s / (b s + HALF_TOKENS), scaled so
# that `spec.flops` is reached at FULL_RATE_SAMPLES samples. Time(b) is then exactly a line a + slope * b.
HALF_TOKENS = 512
FULL_RATE_SAMPLES = 8


def _flops_line(flops_per_sample: float, seq_len: int, spec: DeviceSpec) -> tuple[float, float]:
    full = FULL_RATE_SAMPLES * seq_len
    slope = flops_per_sample / spec.flops * full / (full + HALF_TOKENS)
    return slope * HALF_TOKENS / seq_len, slope


def analytic_profile(
    layers: int, hidden: int, heads: int, seq_len: int, vocab: int, spec: DeviceSpec, mixed_precision: bool = True
) -> Profile:
    """A GPT-style transformer's per-layer cost from FLOPs at `spec.flops` and the usual activation count.

    Block forward FLOPs per sample: 24 s h^2 + 4 s^2 h; backward twice that. Activation bytes kept per
    sample and block under mixed precision: s h (34 + 5 a s / h) (Korthikanti et al., 2022); the block's
    output, the stash under recompute, is 2 s h bytes.
    """
    s, h = seq_len, hidden
    byte = 2 if mixed_precision else 4
    block_flops = 24 * s * h * h + 4 * s * s * h
    keep = s * h * (34 + 5 * heads * s / h) * (byte / 2)
    out = byte * s * h
    blk = LayerCost(
        "block",
        12 * h * h + 13 * h,
        _flops_line(block_flops, s, spec),
        _flops_line(2 * block_flops, s, spec),
        keep,
        out,
        out,
    )
    head_flops = 2 * s * h * vocab
    embed = LayerCost("embed", (vocab + s) * h, (0.0, 0.0), (0.0, 0.0), out, out, 0.0)
    head = LayerCost(
        "head",
        vocab * h + 2 * h,
        _flops_line(head_flops, s, spec),
        _flops_line(2 * head_flops, s, spec),
        byte * s * vocab * 2,
        0.0,
        byte * s * vocab,
    )
    # Mixed precision: FP16 weight copies (2 B each version) beside FP32 masters, gradients and Adam moments (16 B).
    return Profile(
        f"analytic: {spec.name}",
        seq_len,
        [embed, *[dataclasses.replace(blk, name=f"block{i + 1}") for i in range(layers)], head],
        weight_bytes_per_param=byte,
        state_bytes_per_param=16 if mixed_precision else GRAD_AND_STATE_BYTES,
        optimizer_s_per_param=spec.optimizer_s_per_param,
        p2p=spec.intra,
        all_reduce=spec.intra,
        memory=spec.memory,
        # The paper's Megatron-based code: fused Adam and bucketed all-reduce, no whole-stage transients.
        optimizer_temp_bytes_per_param=0.0,
        all_reduce_buffer_bytes_per_param=0.0,
        holds_sends=False,
    )


# Links calibrated by the last `planned` cell on this machine; without them the planner assumes these.
ASSUMED_CPU_LINK = Link(latency=100e-6, bandwidth=1e9)


def links_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / f"links-{os.uname().nodename}.json"


def save_links(cache_dir: Path, p2p: Link | None, all_reduce: Link | None) -> None:
    path = links_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else {}
    new = {k: dataclasses.asdict(v) for k, v in (("p2p", p2p), ("all_reduce", all_reduce)) if v is not None}
    path.write_text(json.dumps({**old, **new}, indent=1))


def load_links(cache_dir: Path) -> tuple[Link, Link]:
    """(p2p, all-reduce) calibrated here before, else the assumed CPU link for both."""
    path = links_path(cache_dir)
    saved = json.loads(path.read_text()) if path.exists() else {}
    return (
        Link(**saved["p2p"]) if "p2p" in saved else ASSUMED_CPU_LINK,
        Link(**saved["all_reduce"]) if "all_reduce" in saved else ASSUMED_CPU_LINK,
    )
