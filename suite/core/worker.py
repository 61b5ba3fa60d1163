"""A long-lived cell process: a sweep's single-rank throughput cells one after another, so that imports, the
device's context, compiled kernels and each model shape's build are paid once, not per cell-round.

    python -m suite.core.worker      (one job per line on stdin: {"payload": Cell.resolved(), "out": path})

Each job's outcome is written to its `out` path (atomically), as a cell process writes it, with
`provenance.worker` saying which worker and job it was and what its pool held. Between jobs the allocator's
cache, its peak statistics and memory cap, and the host's peak resident set are reset. The runner's side
(suite.core.launcher.Worker) starts it under the orphan guard, times each job out, and records a dead worker's
job with its status; a method that keeps state on the host (L2L) runs with the pool emptied and off, so that its
host memory is its own.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch


def between_cells() -> bool:
    """Give back what the last cell left (the allocator's cache and cap, pinned host blocks) and start the peaks
    again; whether the host's peak could be reset."""
    from suite.measure.memory import reset_host_peak

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        for i in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(1.0, i)
            torch.cuda.reset_peak_memory_stats(i)
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()
    return reset_host_peak()


def run_job(job: dict, n: int) -> dict:
    from suite.core import registry
    from suite.core.cell import execute
    from suite.harness import model

    method = job["payload"].get("run", {}).get("method")
    hosts = registry.is_registered(method) and registry.get(method).hosts_state
    if hosts and model.POOL is not None:
        model.POOL.clear()
    pool, model.POOL = model.POOL, (None if hosts else model.POOL)
    hits = pool.hits if pool is not None else 0
    try:
        reset = between_cells()
        outcome = execute(job["payload"])
    finally:
        model.POOL = pool
    held = model.POOL.held_bytes() if model.POOL is not None else 0
    if isinstance(outcome.get("provenance"), dict):
        outcome["provenance"]["worker"] = {
            "pid": os.getpid(),
            "job": n,
            "pooled_model": not hosts,
            "model_from_pool": pool is not None and pool.hits > hits,  # a copy of a model built for an earlier job
            "pool_held_bytes": held,  # in the host's peak resident set (host_peak_gb) of this job
            "host_peak_reset": reset,
        }
    return outcome


def main() -> int:
    from suite.harness import model

    model.POOL = model.ModelPool()
    for n, line in enumerate(sys.stdin, 1):
        job = json.loads(line)
        outcome = run_job(job, n)
        tmp = job["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(outcome, f, default=str)
        os.replace(tmp, job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
