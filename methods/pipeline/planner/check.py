"""Planner predictions against measured pipeline runs: the `planned` cell kind (measure, calibrate, predict)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from methods.pipeline.method import PipelineMethod
from methods.pipeline.planner.costmodel import save_links
from methods.pipeline.planner.costs import Link
from methods.pipeline.planner.predict import predict
from methods.pipeline.planner.profiling import cached_profile
from suite.core.cell import throughput_cell


def _fit_link(samples: list[tuple[int, float]]) -> Link:
    """Latency and bandwidth from (bytes, seconds) at a small and a large size."""
    (n0, t0), (n1, t1) = samples[0], samples[-1]
    bw = (n1 - n0) / max(t1 - t0, 1e-9)
    return Link(latency=max(t0 - n0 / bw, 0.0), bandwidth=bw)


def calibrate_p2p(sizes=(256, 1 << 20), repeats: int = 20, device: torch.device = torch.device("cpu")) -> Link | None:
    """Ping-pong between ranks 0 and 1 (others idle): one-way seconds at each size. Collective."""
    from suite.harness.device import synchronize

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    rank, samples = dist.get_rank(), []
    for n in sizes:
        buf = torch.zeros(n // 4, device=device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        synchronize(device)
        samples.append((n, (time.perf_counter() - t0) / (2 * repeats)))
    dist.barrier()
    return _fit_link(samples)


def calibrate_all_reduce(
    sizes=(256, 1 << 20), repeats: int = 10, device: torch.device = torch.device("cpu")
) -> Link | None:
    """All-reduce over every rank: seconds at each size, fitted as latency + bytes/bandwidth on the ring
    volume 2(n-1)/n of the tensor, the same volume the planner charges. Collective."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    from suite.harness.device import synchronize

    world, samples = dist.get_world_size(), []
    for n in sizes:
        buf = torch.zeros(n // 4, device=device)
        dist.barrier()
        times = []
        for _ in range(repeats):
            synchronize(device)
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            synchronize(device)
            times.append(time.perf_counter() - t0)
        samples.append((2 * (world - 1) / world * n, statistics.median(times)))
    dist.barrier()
    return _fit_link(samples)


def planned_cell(run, device, cap) -> dict:
    """Measure a pipeline method (throughput cell), calibrate the links it used, then predict the same
    configuration from the cached per-layer profile and report the relative errors (predicted / measured - 1)."""
    from suite.config.paths import RESULTS_DIR
    from suite.core import registry

    cls = registry.get(run.method)
    if not issubclass(cls, PipelineMethod):
        raise ValueError(f"method {run.method!r} is not a pipeline; the planner predicts pipeline methods")
    measured = throughput_cell(run, device, cap)
    p2p, ring = calibrate_p2p(device=device), calibrate_all_reduce(device=device)
    if dist.is_initialized() and dist.get_rank() != 0:
        return measured  # rank 0 writes the record
    o = cls.resolved_options(run)
    d, w = o["stages"], o["width"]
    threads = torch.get_num_threads()
    cache = Path(RESULTS_DIR) / ".cache" / "profiles"
    prof = cached_profile(run, cache, threads=threads, device=device)
    save_links(cache, p2p, ring)  # `suite plan` on this machine reuses them
    prof.p2p, prof.all_reduce = p2p or Link(), ring or Link()
    pred = predict(prof, run.method, d, w, run.micro_batch_size, run.num_micro_batches // w, o["recompute"])
    worst = max(measured.get("rank_memory") or [measured["device_peak_allocated"]])
    return {
        **measured,
        "predicted_throughput": pred.throughput,
        "predicted_step_time": pred.step_time,
        "predicted_memory_gb": pred.memory / 1e9,
        "predicted_stage_memory": pred.stage_memory,
        "measured_memory_gb": worst / 1e9,
        "throughput_error": pred.throughput / measured["throughput"] - 1,
        "memory_error": pred.memory / worst - 1,
        "predicted_bubble": pred.bubble,
        "profile_source": prof.source,
        "p2p_link": vars(prof.p2p),
        "all_reduce_link": vars(prof.all_reduce),
        "threads": threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
