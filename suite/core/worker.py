"""A long-lived cell process: a sweep's single-rank throughput cells one after another, so that imports, the
device's context, compiled kernels and each model shape's build are paid once, not per cell-round.

    python -m suite.core.worker      (one job per line on stdin: {"payload": Cell.resolved(), "out": path})

Each job's outcome is written to its `out` path (atomically), as a cell process writes it, with
`provenance.worker` saying which worker and job it was and what its pool held. Between jobs the allocator's
cache, its peak statistics and memory cap, the pinned-host cache, the host's peak resident set and torch's
per-process settings (process_settings: threads, TF32 and the FP32 matmul precision, cuDNN's and determinism's
flags, default dtype and device, grad and anomaly modes) go back to where the worker began.
Before each job the worker proves it is as a fresh process would be for what the cell uses (suite.core.isolation:
no library function replaced, none of the suite's or a plugin's set on torch or transformers, no thread left
running, none of the job's code files changed since an earlier job named them: code_moved); where it is not, and
after a job whose method declares `patches_globals`, it ends, and the job runs in a fresh worker. The runner's side
(suite.core.worker_client.Worker) starts it under the orphan guard, times each job out, and records a dead worker's
job with its status. Every method takes its copy from the pool, L2L among them: the pool's pristine model stays
resident through the job, so a job's host peak (`host_peak_gb`) holds `pool_held_bytes` besides its own.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch

from suite.config.files import write_atomic


def process_settings() -> dict:
    """What torch keeps per process that changes a cell's numbers or speed if one cell leaves it changed: the
    intra-op threads, TF32 for matmuls and cuDNN, the FP32 matmul precision, cuDNN's autotuning and determinism,
    deterministic algorithms, the default dtype and device, autograd's grad and anomaly modes."""
    return {
        "threads": torch.get_num_threads(),
        "tf32": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic),
        "deterministic": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "dtype": torch.get_default_dtype(),
        "device": torch.get_default_device(),
        "grad": torch.is_grad_enabled(),
        "anomaly": torch.is_anomaly_enabled(),
    }


def restore(settings: dict) -> None:
    """Put `settings` (process_settings()) back; TF32 before the matmul precision, which its setter rewrites."""
    torch.set_num_threads(settings["threads"])
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = settings["tf32"]
    torch.set_float32_matmul_precision(settings["matmul_precision"])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = settings["cudnn"]
    on, warn_only = settings["deterministic"]
    torch.use_deterministic_algorithms(on, warn_only=warn_only)
    torch.set_default_dtype(settings["dtype"])
    torch.set_default_device(settings["device"])
    torch.set_grad_enabled(settings["grad"])
    torch.set_anomaly_enabled(settings["anomaly"])


STARTED_WITH: dict = {}  # process_settings() when the worker started, what every job starts from


def between_cells() -> bool:
    """Give back what the last cell left (the allocator's cache and cap, pinned host blocks, torch's per-process
    settings as the worker started with them) and start the peaks again; whether the host's peak could be reset.
    The keyed dropout's record of the paths taken is reset by the cell itself (suite.core.cell.execute)."""
    from suite.measure.memory import reset_host_peak

    if STARTED_WITH:
        restore(STARTED_WITH)
        if process_settings() != STARTED_WITH:  # a setting restore() cannot put back: say so, never run on silently
            raise RuntimeError(f"the worker's torch settings could not be restored: {process_settings()}")
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
    from suite.core.cell import execute
    from suite.harness import model
    from suite.harness.device import leave_group

    pool = model.POOL
    hits = pool.hits if pool is not None else 0
    reset = between_cells()
    try:
        outcome = execute(job["payload"])
    finally:
        leave_group()  # a peer's one-rank process group: the next cell that needs one joins its own
    held = model.POOL.held_bytes() if model.POOL is not None else 0
    if isinstance(outcome.get("provenance"), dict):
        outcome["provenance"]["worker"] = {
            "pid": os.getpid(),
            "job": n,
            "model_from_pool": pool is not None and pool.hits > hits,  # a copy of a model built for an earlier job
            "pool_held_bytes": held,  # in the host's peak resident set (host_peak_gb) of this job
            "host_peak_reset": reset,
        }
    return outcome


def patches_globals(payload: dict) -> bool:
    """Whether the job's method declares that it changes process state (Method.patches_globals)."""
    from suite.core import registry

    method = ((payload.get("run") or {}) if isinstance(payload, dict) else {}).get("method")
    try:
        return bool(getattr(registry.get(method), "patches_globals", False))
    except Exception:  # noqa: BLE001 — an unknown method is the job's own error to report
        return False


def code_moved(payload: dict, seen: dict[str, str]) -> list[str]:
    """Whether the job's code files (suite.core.cell_code) hold other contents than when an earlier job of this worker
    first named them: the worker may hold their older modules, so the job runs in a fresh process (its record would
    state code it did not run). `seen` takes the files this job names for the first time."""
    from suite.core.cell_code import code_of_payload

    files = code_of_payload(payload)["code_files"]
    moved = sorted(f for f, digest in files.items() if seen.get(f, digest) != digest)
    for f, digest in files.items():
        seen.setdefault(f, digest)
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    return [f"{', '.join(moved[:3])}{more} changed since this worker ran an earlier cell"] if moved else []


def main() -> int:
    from suite.core.isolation import Baseline
    from suite.harness import model

    model.POOL = model.ModelPool()
    STARTED_WITH.update(process_settings())
    baseline, seen = Baseline(), {}
    for n, line in enumerate(sys.stdin, 1):
        job = json.loads(line)
        gc.collect()  # the last job's objects, and what they hold (a method's host thread), go first
        moved = code_moved(job["payload"], seen)
        taint = (baseline.taint() + moved) if n > 1 else []
        if taint:  # not as a fresh process would be: the job goes to a fresh one
            write_atomic(job["out"], json.dumps({"worker_tainted": taint}))
            return 0
        write_atomic(job["out"], json.dumps(run_job(job, n), default=str))
        if patches_globals(job["payload"]):  # declared: no later job runs in this process (the client knows it too)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
