"""Per-layer profiles measured on this machine (time, and bytes from a live-bytes tracker; bytes alone counted on fake
tensors), cached as JSON."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from methods.pipeline.planner.costs import LayerCost, Line, Profile
from suite.config.files import read_object, write_atomic


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


def _fit(points: list[tuple[int, float]]) -> Line:
    """Least-squares line through (b, value); one point gives a line through the origin."""
    if len(points) == 1:
        b, v = points[0]
        return Line(0.0, v / b)
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mv = sum(v for _, v in points) / n
    slope = sum((b - mb) * (v - mv) for b, v in points) / sum((b - mb) ** 2 for b, _ in points)
    return Line(mv - slope * mb, slope)


class LayerSample(NamedTuple):
    """One layer measured at one micro-batch size: median seconds, and bytes (whole micro-batch)."""

    forward: float
    backward: float
    keep: int  # what the forward with autograd keeps until the backward
    out: int  # the layer's output (0 for the last layer)
    work: int  # the backward's transient peak over what was kept


def _layer_pass(model, ctx, repeats: int, device: torch.device = torch.device("cpu")) -> list[LayerSample]:
    """Per layer: median forward and backward seconds, kept/output/transient bytes (live-bytes tracker on
    CPU, the allocator's counters on CUDA). With no `repeats`, bytes alone (the times 0): what a memory search
    needs, with one untimed pass a layer before the tracked one (so the gradients exist, as after timed ones)."""
    n = model.num_layers
    samples = []
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

        grad_out = None if i == n - 1 else torch.ones_like(xs[i + 1])

        def both():
            y = forward()
            torch.autograd.backward(y, grad_out)

        if repeats:
            fwd = _median_time(forward, repeats, device)
            bwd = max(_median_time(both, repeats, device) - fwd, 0.0)
        else:  # one pass, untimed: the gradients exist, as the tracked pass below finds them in a timed profile
            both()
            fwd = bwd = 0.0
        model.zero_grad(set_to_none=False)  # gradients exist: the tracked pass books activations only
        x_in = inp()
        with _bytes_tracker(device) as tr:
            y = model.forward_layer(i, x_in, ctx)
            keep = tr.live
            out = y.numel() * y.element_size() if i < n - 1 else 0
            before = tr.live
            tr.peak = before
            torch.autograd.backward(y, grad_out)
            work = max(tr.peak - before, 0)
            del y
        model.zero_grad(set_to_none=True)
        samples.append(LayerSample(fwd, bwd, keep, out, work))
    return samples


def _layer_cost(name: str, params: int, sizes, samples: list[LayerSample]) -> LayerCost:
    """One layer's lines through its samples at each micro-batch size in `sizes`; bytes per sample (the slopes)."""

    def line(values) -> Line:
        return _fit(list(zip(sizes, values)))

    def per_sample(values) -> float:  # bytes grow with b; the intercept is noise
        return max(line(values).slope, 0.0)

    return LayerCost(
        name,
        params,
        forward=line([s.forward for s in samples]),
        backward=line([s.backward for s in samples]),
        keep_bytes=per_sample([s.keep for s in samples]),
        out_bytes=per_sample([s.out for s in samples]),
        work_bytes=per_sample([s.work for s in samples]),
    )


def measure_profile(
    run,
    micro_batch_sizes: tuple[int, ...] = (2, 4, 8),
    repeats: int = 5,
    threads: int | None = None,
    device: torch.device | None = None,
    timed: bool = True,
) -> Profile:
    """Time and track every layer of `run`'s model on `device` (default CPU) at each micro-batch size; fit lines.
    Without `timed`, its bytes alone (every time 0; on the CPU counted on fake tensors): the same bytes as a timed
    profile's, in seconds at any size, for what asks only how much fits (an experiment's rows, never a timed figure)."""
    device = torch.device("cpu") if device is None else device
    if threads:
        torch.set_num_threads(threads)
    # Bytes alone on the CPU are counted on fake tensors: the same storages come and go as in a real pass (the
    # live-bytes tracker follows storages, not data), and no arithmetic runs, so a paper-size model takes seconds.
    fake = FakeTensorMode(allow_non_fake_inputs=True) if not timed and device.type == "cpu" else nullcontext()
    with fake:
        return _measure(run, micro_batch_sizes, repeats, device, timed)


def _measure(run, micro_batch_sizes: tuple[int, ...], repeats: int, device: torch.device, timed: bool) -> Profile:
    from suite.harness.data import synthetic_batch
    from suite.harness.model import build_model
    from suite.harness.optim import LayerwiseOptimizer
    from suite.measure.provenance import device_info

    model = build_model(run.model, run.seed)
    model = model if device.type == "cpu" else model.to(device)  # (fake parameters cannot be swapped in place)
    per_b = {}
    for b in micro_batch_sizes:
        mb = synthetic_batch(0, b, run.seq_len, run.model.vocab_size, run.model.num_labels, run.seed).to(device)
        ctx = model.begin(mb, run.seed, 0, b)
        if timed:
            _layer_pass(model, ctx, 1, device)  # warm-up: first calls pay for allocations and kernel selection
        per_b[b] = _layer_pass(model, ctx, repeats if timed else 0, device)
    layers = []
    for i in range(model.num_layers):
        params = sum(p.numel() for _, p in model.layer_named_parameters(i))
        name = "embed" if i == 0 else "head" if i == model.num_layers - 1 else f"block{i}"
        layers.append(_layer_cost(name, params, micro_batch_sizes, [per_b[b][i] for b in micro_batch_sizes]))
    # Optimizer: one LAMB/AdamW step over the whole model, per parameter.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    named = [model.layer_named_parameters(i) for i in range(model.num_layers)]
    opt = LayerwiseOptimizer(named, run, host=device.type == "cpu")  # (a fake CPU step too: the host's kernels)
    total = sum(p.numel() for p in model.parameters())
    steps = lambda: [opt.step_layer(j, 0) for j in range(len(named))]  # noqa: E731
    # (untimed, one step all the same: it makes the state the tracked step below finds, as the timed ones do)
    opt_s = _median_time(steps, repeats, device) / total if timed else (steps(), 0.0)[1]
    big = max(range(len(named)), key=lambda j: sum(p.numel() for _, p in named[j]))
    with _bytes_tracker(device) as tr:
        opt.step_layer(big, 1)
    temp = tr.peak / sum(p.numel() for _, p in named[big])
    where = device_info(device).get("device", device.type) if device.type == "cuda" else "cpu"
    source = f"measured: {where}, {torch.get_num_threads()} thread(s)" if timed else f"counted: {where}, bytes only"
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
    timed: bool = True,
) -> Profile:
    """measure_profile, cached per model, machine and device as JSON under `cache_dir` (seconds to minutes)."""
    cuda = device if device is not None and device.type == "cuda" else None
    key = profile_key(run, micro_batch_sizes, threads, cuda) + ("" if timed else "-bytes")
    path = Path(cache_dir) / f"{key}.json"
    stored = None if refresh else read_object(path)
    if stored is not None:
        try:
            return Profile.from_dict(stored)
        except (KeyError, TypeError, ValueError):  # another shape: measured again, below
            pass
    prof = measure_profile(run, tuple(micro_batch_sizes), threads=threads, device=device, timed=timed)
    write_atomic(path, json.dumps(prof.to_dict(), indent=1))  # whole or not at all: a killed run leaves none
    return prof
