"""Runs one cell in its own process: build the method, measure it, write one record with exactly one status."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback

import torch

from suite.config.errors import ConfigError
from suite.core.kinds import KINDS, kind
from suite.harness import fused_lamb, host_commit, rng
from suite.harness.device import device_type
from suite.measure import flops
from suite.records.schema import Outcome


def check_cells(cells) -> None:
    """Every method constraint of every cell, before any process is launched: a broken one is a one-line
    ConfigError naming the cell, the constraint and a valid choice (not a traceback from every rank)."""
    for cell in cells:
        if not cell.spec.builds_method or (method := cell.method_class) is None:
            continue
        if method.unavailable() is not None:
            continue  # recorded not_implemented with the reason by the runner; the rest of the sweep runs
        try:
            method.check_config(cell.run)
        except ConfigError as exc:
            raise ConfigError(f"{cell.experiment}/{cell.row.name}: {exc}") from None


def cell_options(cls, run, what: str):
    """The dataclass `cls` filled from run.options, which may also hold the method's own options; any other
    key is an error naming what `what` (e.g. "fine-tuning") accepts."""
    from suite.core import registry

    mine = {f.name for f in dataclasses.fields(cls)}
    theirs = registry.get(run.method).options if registry.is_registered(run.method) else {}
    unknown = sorted(k for k in run.options if k not in mine and k not in theirs)
    if unknown:
        raise ConfigError(f"unknown {what} option(s) {unknown}; accepted: {sorted(mine | set(theirs))}")
    return cls(**{k: v for k, v in run.options.items() if k in mine})


def throughput_cell(run, device, cap) -> dict:
    """Synthetic batches through the method: median step time, device and host memory peaks."""
    from suite.measure.step import measure

    method, batches = _method_and_batches(run, device)
    return _figures(method, run, device, measure(method, batches, run.warmup, run.steps, device, cap).summary())


def throughput_rounds_cell(run, device, cap) -> dict:
    """throughput_cell's measurement run.options["rounds_inside"] times over one build of the method: one warm-up,
    then that many rounds of run.steps timed steps, each round's figures a round of the record (merged here as
    suite.core.rounds merges rounds of separate processes; the sweep's merge keeps them apart). For a model whose
    build takes minutes of the host and of which the host holds one copy only (Llama 3 8B: 32 GB of FP32 made by a
    serial generator), where a process a round would spend its loan building."""
    from suite.core.rounds import merge
    from suite.measure.step import measure

    method, batches = _method_and_batches(run, device)
    rounds = []
    for r in range(run.options.get("rounds_inside", 1)):
        m = measure(method, batches, run.warmup if r == 0 else 0, run.steps, device, cap).summary()
        rounds.append({"status": "ok", "metrics": _figures(method, run, device, m), "provenance": None})
    return merge(rounds, len(rounds))["metrics"]


def _method_and_batches(run, device):
    from suite.core.check import build_method
    from suite.harness.data import synthetic_batches

    method = build_method(run, device)
    batches = synthetic_batches(run)
    if run.ranks > 1 and method.shards_batch:
        # Data-parallel ranks take their share of the global minibatch (offsets stay global); a
        # pipeline's stages all see the whole minibatch.
        rank, world = int(os.environ.get("RANK", 0)), run.ranks
        batches = (b.shard(rank, world) for b in batches)
    return method, batches


def _figures(method, run, device, m: dict) -> dict:
    """A measurement's summary with what a throughput cell adds: each rank's memory, the bytes a step copied between
    host and device where the method tallies them, the whole minibatch's rate across ranks, and on CUDA the achieved
    TFLOPS and MFU."""
    m.update(rank_memory(m["device_peak_allocated"]))
    moved = [(m.get("timeline") or {}).get(k) for k in ("h2d_bytes", "d2h_bytes")]
    if all(isinstance(v, (int, float)) for v in moved):  # a method that tallies its copies (L2L): a step's, both ways
        m["pcie_gb"] = sum(moved) / 1e9
    if run.ranks > 1:  # rank 0 timed its share; the cell's throughput is the whole minibatch's
        m["throughput_per_rank"] = m["throughput"]
        m["throughput"] = run.batch_size / m["step_time_median"]
    if device.type == "cuda":  # achieved TFLOPS and MFU beside samples/s (suite.measure.flops states the formula)
        cls = type(method)
        m.update(flops.cuda_metrics(run, device, m, devices=cls.world_size(run), recompute=cls.recomputes(run)))
    return m


def count_cell(run, device, cap) -> dict:
    """The method's own step on fake tensors, counted on this machine's CPU whatever it has: memory, not time.
    Past the cap (the paper's 16 GiB) the count raises out-of-memory, as the device would. Several ranks are
    counted each in a fake process group (its collectives and transfers move nothing), in processes of their
    own: the ranks the method names (Method.counted_ranks), whose worst is the cell's figure."""
    from suite.core import registry
    from suite.measure.memory import apply_device_memory_cap

    cls = registry.get(run.method)
    limit = apply_device_memory_cap(run.device_memory, torch.device("cpu"))
    allowance = cls.count_allowance(run) or 0
    if limit is not None and allowance:  # a peer's offload the count cannot follow: oom only where it is oom anyway
        limit += allowance
    target = torch.device("meta" if cls.hosts_state else "cpu")
    world = cls.world_size(run)
    extra = {"count_allowance_gb": allowance / 1e9} if allowance else {}
    try:
        if world == 1:
            return {**count_rank(run, target, limit), **extra}
        ranks = cls.counted_ranks(run)
        per_rank = _count_ranks(run, target, limit, ranks, world)
    except torch.OutOfMemoryError as exc:
        if not allowance:
            raise
        err = torch.OutOfMemoryError(
            f"{str(exc).splitlines()[0]}: past the {run.device_memory} cap even with the {allowance / 1e9:.1f} GB "
            "of parameters, gradients and optimizer state its offload keeps on the host taken off"
        )
        err.metrics = {**(getattr(exc, "metrics", None) or {}), **extra}
        raise err from None
    worst = max(per_rank, key=lambda m: m["device_peak_allocated"])
    return {
        **worst,
        "counted_ranks": ranks,
        "rank_memory": [m["device_peak_allocated"] for m in per_rank],
        "rank_breakdown": [m["device_breakdown"] for m in per_rank],
        "memory_worst_rank_gb": worst["memory_gb"],
        **extra,
    }


def _count_ranks(run, device, limit, ranks: list[int], world: int) -> list[dict]:
    """count_rank of each rank, in parallel processes (one per core; fresh ones: the fake group is per process).
    A rank past the cap raises out-of-memory here, as it would have there."""
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    if len(ranks) == 1:
        return [count_rank(run, device, limit, ranks[0], world)]
    workers = min(len(ranks), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(count_rank, run, device, limit, r, world) for r in ranks]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f in done and f.exception() is not None), None)
        if failed is not None:  # one rank out of memory is the cell's verdict: the ranks not started need not run
            for f in futures:
                f.cancel()
            raise failed.exception()
        return [f.result() for f in futures]


def count_rank(run, device, limit, rank: int = 0, world: int = 1, round_to: int | None = None) -> dict:
    """Count rank `rank` of `world` (a fake process group when world > 1), after the method's warm-up steps."""
    import torch.distributed as dist

    from suite.core import registry
    from suite.core.check import build_method
    from suite.harness.data import synthetic_batches
    from suite.measure.counting import CUDA_BLOCK, count

    cls = registry.get(run.method)

    def batches():
        stream = synthetic_batches(run, padded=False)
        if world > 1 and cls.shards_batch:
            return (b.shard(rank, world) for b in stream)
        return stream

    if world > 1:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        build = lambda: build_method(run, device)  # noqa: E731
        # Keyed dropout as the run's device draws it (the count builds on the CPU or `meta`): its masks' bytes.
        with rng.forced(rng.path_for(torch.device(device_type(run.device)))):
            return count(build, batches, device, cls.steady_after, CUDA_BLOCK if round_to is None else round_to, limit)
    finally:
        if world > 1:
            dist.destroy_process_group()


def rank_memory(peak: int) -> dict:
    """Under several ranks, every rank's device peak (rank 0 alone measures its own, a pipeline's first
    stage); the worst rank is what each device must hold. Collective: every rank calls it."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return {}
    peaks: list = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, int(peak))
    return {"rank_memory": peaks, "memory_worst_rank_gb": max(peaks) / 1e9}


# The allocators' own out-of-memory failures: torch's device allocator (and the suite's caps and counts, which raise
# its type), Python's, and two that torch raises as a RuntimeError (or its AcceleratorError) carrying a fixed text:
# a CUDA call's allocation outside the caching allocator (`CUDA error: out of memory`) and the host allocator under a
# ulimit (`[enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate memory`). Words in another
# type's message never make an `oom`: that verdict is final, never retried (issue 52, item 4).
OOM_TYPES = (torch.OutOfMemoryError, MemoryError)
OOM_RUNTIME = ("CUDA error: out of memory", "DefaultCPUAllocator: can't allocate memory")


def classify(exc: BaseException) -> str:
    """Status of a failed cell: the allocators' out-of-memory failures (OOM_TYPES, OOM_RUNTIME) are `oom`, anything
    else `error: <type>: <message>`."""
    if isinstance(exc, OOM_TYPES) or (isinstance(exc, RuntimeError) and any(t in str(exc) for t in OOM_RUNTIME)):
        return "oom"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"error: {type(exc).__name__}: {msg}"[:300]


def execute(payload: dict) -> Outcome:
    """Run the cell described by `payload` (Cell.resolved()) and return its record."""
    from suite.config.run import RunConfig
    from suite.harness.device import resolve_device
    from suite.measure.contention import Watch
    from suite.measure.memory import apply_device_memory_cap
    from suite.measure.provenance import provenance

    started = time.time()
    code = _code(payload)  # as the files are when the cell starts: compared with them at its end
    rng.reset()  # the paths this cell's draws take are its own, not those of the cells a worker ran before it
    fused_lamb.reset()  # and so is the host LAMB's kernel (a worker's earlier L2L cell asked for it, not this one)
    host_commit.reset()  # and L2L-CMP's host commit
    record = {"status": "error: did not start", "metrics": {}, "error": None}
    device = torch.device("cpu")
    cap = None
    try:
        run = RunConfig.from_dict(payload["run"]).validate()
        name = payload.get("kind", "throughput")
        # A count runs on fake tensors on the host whatever the run's device (one made for CUDA without CUDA too).
        device = (
            torch.device("cpu")
            if kind(name).on_host
            else resolve_device(run.device, int(os.environ.get("LOCAL_RANK", 0)))
        )
        cap = apply_device_memory_cap(run.device_memory, device)
        torch.manual_seed(run.seed)
        if kind(name).watched:  # a benchmark's own times: the machine's load over the whole cell beside them
            with Watch() as watch:
                record["metrics"] = KINDS.load(name)(run, device, cap)
            record["metrics"].setdefault("contention", watch.finish([]))
        else:
            record["metrics"] = KINDS.load(name)(run, device, cap)
        record["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 — every failure becomes a status, never a lost cell
        record["status"] = classify(exc)
        record["metrics"] = getattr(exc, "metrics", None) or {}  # e.g. a projection's memory past its cap
        record["error"] = traceback.format_exc()[-4000:]
        if isinstance(exc, KeyboardInterrupt):
            record["status"] = "error: interrupted"
    record["provenance"] = provenance(device, payload.get("profile", "?"), cap, _settled(code, _code(payload)))
    record["duration_s"] = time.time() - started
    return record


def _code(payload: dict) -> dict:
    """The code the cell ran (suite.core.cell_code), or none where it cannot be told (a payload without a run)."""
    from suite.core.cell_code import code_of_payload

    try:
        return code_of_payload(payload)
    except Exception:  # noqa: BLE001 — the record is kept whatever: one of no code is never current
        return {}


def _settled(before: dict, after: dict) -> dict:
    """The cell's code where its files were the same at its start and end; else no code (`code: None`, never current:
    the record is measured again) with the files that changed while it ran in `code_changed`."""
    if before.get("code") == after.get("code"):
        return after
    from suite.measure import sources

    return {
        "code": None,
        "code_changed": sources.changed(before.get("code_files") or {}, after.get("code_files") or {}),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m suite.core.cell CELL.json OUT.json", file=sys.stderr)
        return 2
    if "LOCAL_RANK" in os.environ:  # a torchrun rank: die with torchrun, which dies with the runner
        from suite.core.orphans import die_with_parent

        die_with_parent()
    with open(argv[0]) as f:
        payload = json.load(f)
    record = execute(payload)
    if int(os.environ.get("RANK", 0)) == 0:
        tmp = argv[1] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, default=str)
        os.replace(tmp, argv[1])
    # A failed rank must exit non-zero, or torchrun leaves its peers waiting until their timeouts.
    if record["status"] != "ok" and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        return 1
    from suite.harness.device import leave_group

    leave_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
