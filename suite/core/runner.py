"""Runs an experiment's cells in fresh processes that die with the runner, in interleaved rounds, cached per machine."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.launch import Nodes, torchrun_command
from suite.core import registry
from suite.core.cell import check_cells
from suite.core.experiment import Cell, Experiment, resolve_profile
from suite.core.kinds import is_timed, kind
from suite.core.nodes import Coordinator
from suite.core.rounds import merge, resumable
from suite.measure.machine import fingerprint
from suite.measure.step import METHODOLOGY_VERSION
from suite.records import store, tracking


def _command(world: int, cfg_path: str, out_path: str, nodes: Nodes | None, rdzv_id: str | None) -> list[str]:
    guard = [sys.executable, "-m", "suite.core.orphans", str(os.getpid())]  # dies with this runner
    if world > 1:  # this machine's ranks, or this node's share of them (node 0's sweep holds the rendezvous store)
        return guard + torchrun_command(world, "suite.core.cell", [cfg_path, out_path], nodes, rdzv_id, store_held=True)
    return guard + [sys.executable, "-m", "suite.core.cell", cfg_path, out_path]


def world_of(cell: Cell) -> int:
    """How many ranks the cell runs on (through torchrun when more than one); a count takes every rank in one."""
    if kind(cell.kind).one_process:
        return 1
    return registry.get(cell.run.method).world_size(cell.run) if registry.is_registered(cell.run.method) else 1


def run_cell(cell: Cell, timeout: float | None = None) -> dict:
    """Run one cell in a subprocess on this machine; returns its record with exactly one status."""
    record, failure = launch(cell.resolved(), world_of(cell), cell.timeout if timeout is None else timeout)
    return record or failure


def _not_run(cls, measure: str) -> str | None:
    """Why a registered method's cell is recorded without running: its library missing here, or a count it
    cannot take."""
    if (why := cls.unavailable()) is not None:
        return f"unavailable here: {why}"
    return f"not counted: {cls.uncounted}" if measure == "count" and cls.uncounted else None


def launch(
    payload: dict, world: int, timeout: float, nodes: Nodes | None = None, rdzv_id: str | None = None
) -> tuple[dict | None, dict]:
    """Run the cell `payload` (Cell.resolved()) on `world` ranks, this node's share of them when `nodes` spans
    several. Returns (rank 0's record if it was written on this node, else None; the record the cell gets
    without it: `timeout`, `oom` when the kernel killed it, or an error with the log's tail)."""
    with tempfile.TemporaryDirectory(prefix="suite-cell-") as tmp:
        cfg_path, out_path, log_path = (os.path.join(tmp, n) for n in ("cell.json", "out.json", "log.txt"))
        with open(cfg_path, "w") as f:
            json.dump(payload, f, default=str)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [paths.ROOT, os.environ.get("PYTHONPATH")]))}
        # One OpenMP team per core across this machine's ranks: oversubscribed teams spin and can make a
        # small CPU step tens of times slower. An explicit OMP_NUM_THREADS wins.
        here = nodes.ranks_per_node(world) if nodes is not None and world > 1 else world
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // here)))
        with open(log_path, "w") as log:
            # A new session so that a timeout kills the cell and every rank it started.
            proc = subprocess.Popen(
                _command(world, cfg_path, out_path, nodes, rdzv_id),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=paths.ROOT,
                start_new_session=True,
            )
            status = None
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = "timeout"
            except KeyboardInterrupt:
                status = "error: interrupted"
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        log_tail = Path(log_path).read_text(errors="replace")[-4000:]
        if status is None and os.path.exists(out_path):
            with open(out_path) as f:
                return json.load(f), {}
        if status is None:
            status = f"error: cell process exited with code {proc.returncode} without a record"
            if proc.returncode and proc.returncode < 0 and -proc.returncode == signal.SIGKILL:
                status = "oom"  # killed by the kernel's OOM killer
        return None, {"status": status, "metrics": {}, "error": log_tail, "provenance": None}


def run_cell_on_nodes(cell: Cell, timeout: float | None, coord: Coordinator, sweep_id: str, tag: str) -> dict:
    """Node 0's side of a multi-rank cell across nodes: post the launch, run this node's ranks, and take rank 0's
    record from this node or from the node that got it."""
    nodes, world = coord.nodes, world_of(cell)
    timeout = cell.timeout if timeout is None else timeout
    payload, rdzv_id = cell.resolved(), f"{nodes.rdzv_id}-{sweep_id}-{coord.posted}"
    n = coord.post({"payload": payload, "world": world, "timeout": timeout, "rdzv_id": rdzv_id, "tag": tag})
    started = time.monotonic()
    record, failure = launch(payload, world, timeout, nodes, rdzv_id)
    where = 0
    if record is None and failure["status"] not in ("timeout", "error: interrupted"):
        # Rank 0 ran on another node (or failed): its node reports when its own agent is done.
        got = coord.record(n, timeout - (time.monotonic() - started) + 30)
        if got is not None:
            where, record = got
    if record is None:
        return failure
    return {**record, "rank0_node": where}


def follow(nodes: Nodes, progress=print) -> None:
    """A node other than 0: run this node's ranks of every launch node 0 posts, send back rank 0's record when it
    ran here, and write nothing (node 0 writes the records)."""
    coord = Coordinator.join(nodes)
    progress(
        f"node {nodes.node_rank} of {nodes.nnodes}: following node 0 at {nodes.endpoint} (node 0 writes the records)"
    )
    for n, job in coord.launches():
        progress(f"{job['tag']}: running this node's {nodes.ranks_per_node(job['world'])} rank(s) ...")
        started = time.time()
        record, failure = launch(job["payload"], job["world"], job["timeout"], nodes, job["rdzv_id"])
        coord.report(n, record)
        outcome = "rank 0 ran here, its record sent to node 0" if record else failure["status"].splitlines()[0]
        if record is None and failure["status"].startswith("error: cell process exited with code 0"):
            outcome = "done (rank 0 ran on another node)"
        progress(f"{job['tag']}: {outcome} in {time.time() - started:.1f}s")
    progress(f"node {nodes.node_rank}: node 0 ended the sweep")


def variant_of(overrides: list[str] | None, device_memory: str | None, nnodes: int = 1, measure: str = "time") -> str:
    """What makes a run differ from the experiment's default at its profile (empty for the default)."""
    parts = ["counted (fake tensors), not measured"] if measure == "count" else []
    parts += [f"device_memory={device_memory}"] if device_memory else []
    parts += [f"nnodes={nnodes}"] if nnodes > 1 else []
    return ", ".join(parts + [f"set {o}" for o in overrides or []])


MEASURES = ("time", "count")


COUNTABLE = "projected"  # besides the timed kinds: a planner's projection of a method the count can run instead


def counted(cells: list[Cell]) -> list[Cell]:
    """The cells as `count` cells: memory counted on fake tensors, one round each, their own cache keys. A
    projected pipeline row becomes a count of the method itself, each stage as its own rank would hold it; a
    projection of a system no method runs (inter-layer MP) has no count and is left out; a projection's search
    for the largest model becomes a search over counts (`count-search`, in the pipeline planner)."""
    wrong = sorted({c.kind for c in cells if not is_timed(c.kind) and c.kind != COUNTABLE})
    if wrong:
        raise ConfigError(
            f"--measure count counts the memory of a method's step; this experiment's {wrong} cells cannot be "
            "counted (accepted: experiments of throughput or projected cells, e.g. table2-table6, 2bw-fig7)"
        )
    out = []
    for c in cells:
        run = c.run
        if c.kind == COUNTABLE:
            options = {k: v for k, v in run.options.items() if k != "projection"}
            if run.options.get("projection", {}).get("method") not in (None, run.method):
                continue
            if run.options["projection"].get("search") == "max_layers":  # the largest model that fits: counts decide
                run = dataclasses.replace(run, options={**run.options, "executor": "dist"})
                out.append(dataclasses.replace(c, run=run, kind="count-search", timeout=max(c.timeout, 1800.0)))
                continue
            run = dataclasses.replace(run, options={**options, "executor": "dist"})
        out.append(dataclasses.replace(c, run=run, kind="count", timeout=max(c.timeout, 900.0)))
    return out


def new_sweep_id() -> str:
    """A sweep's id: when it started and a random tail (two sweeps in one second still differ)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def run_cells(
    exp: Experiment,
    profile: str = "auto",
    only: list[str] | None = None,
    force: bool = False,
    device_memory: str | None = None,
    overrides: list[str] | None = None,
    wandb_mode: str | None = None,
    results_dir: Path | None = None,
    timeout: float | None = None,
    progress=print,
    rounds: int | None = None,
    deadline: float | None = None,
    nodes: Nodes | None = None,
    measure: str = "time",
) -> tuple[list[Cell], list[dict]]:
    """Run (or reuse) every cell of `exp` on this machine, write one record and one W&B run per cell; returns
    (cells, records). Throughput cells run `rounds` times (the experiment's default), the cells of one round
    after another (ABC ABC ABC) so that drift hits all alike. A record is reused only on the machine that made it.

    A partial record (rounds left when a call ended) resumes: its measured rounds are kept and only the missing
    ones run, in its own sweep. With a `deadline` (epoch seconds) no cell-round starts that the longest one seen
    so far would carry past it; the cells left are reported and a later call resumes them.

    Across `nodes` (suite.core.nodes): node 0 does all of this, its multi-rank cells spanning every node; another
    node follows node 0's launches and returns (cells, []), having written nothing.

    The tables are the face's to render (suite.sweep): the engine stands below the reports."""
    results_dir = Path(results_dir or paths.RESULTS_DIR)
    profile = resolve_profile(profile)
    rounds = exp.rounds if rounds is None else rounds
    if rounds < 1:
        raise ConfigError(f"--rounds {rounds}: give 1 or more timing rounds (3 or more to see the noise)")
    nodes = (nodes or Nodes()).validate()
    mode = tracking.resolve_mode(wandb_mode)
    cells = (
        counted(exp.cells(profile, only, overrides, device_memory, counting=True))
        if measure == "count"
        else (exp.cells(profile, only, overrides, device_memory))
    )
    check_cells(cells)
    if nodes.multi:
        for c in cells:  # every node starts the same number of ranks: checked before any process starts
            if world_of(c) > 1:
                nodes.ranks_per_node(world_of(c), f"{c.experiment}/{c.row.name}: ")
        cells = [dataclasses.replace(c, nnodes=nodes.nnodes) for c in cells]
        if nodes.node_rank:
            follow(nodes, progress)
            return cells, []
    variant = variant_of(overrides, device_memory, nodes.nnodes, measure)
    fp = fingerprint()
    here, sweep_id = fp["slug"], new_sweep_id()
    tags = {
        c.key: f"[{i}/{len(cells)}] {exp.name}/{c.row.name} ({c.row.method}, {profile})" for i, c in enumerate(cells, 1)
    }
    records: dict[str, dict] = {}
    todo, done = [], {}
    for cell in cells:
        cached = store.load(results_dir, cell.key, here, warn=progress)
        kept = [] if force else resumable(cached, METHODOLOGY_VERSION)
        if kept:
            done[cell.key] = kept
            sweep_id = cached.get("sweep") or sweep_id  # the rounds go on in the sweep they began in
        if cached and cached["status"] in store.FINISHED and not force:
            progress(f"{tags[cell.key]}: {cached['status']} (cached on {here}, {cell.key})")
            records[cell.key] = cached
        elif not registry.is_registered(cell.row.method):
            error = f"method {cell.row.method!r} is not registered yet"
            record = {"status": "not_implemented", "metrics": {}, "error": error, "provenance": None}
            records[cell.key] = _finish(record, cell, exp, profile, variant, fp, sweep_id, results_dir)
        elif (why := _not_run(registry.get(cell.run.method), measure)) is not None:
            record = {"status": "not_implemented", "metrics": {}, "error": why, "provenance": None}
            records[cell.key] = _finish(record, cell, exp, profile, variant, fp, sweep_id, results_dir)
        else:
            todo.append(cell)
    if todo:
        how = (
            "memory counted on fake tensors, once per cell"
            if measure == "count"
            else f"throughput cells in {rounds} interleaved round(s)"
        )
        verb = "counting" if measure == "count" else "measuring"
        progress(f"{verb} {len(todo)} cell(s) on {here}, sweep {sweep_id}: {how}")
    done = {c.key: done.get(c.key, []) for c in todo}
    for cell in [c for c in todo if len(done[c.key]) >= (rounds if is_timed(c.kind) else 1)]:
        todo.remove(cell)  # resumed with as many rounds as this call asks for: finish it as it stands
        planned = len(done[cell.key])
        records[cell.key] = _finish(
            merge(done[cell.key], planned), cell, exp, profile, variant, fp, sweep_id, results_dir
        )
    coord = Coordinator.host(nodes, progress) if nodes.multi else None  # node 0 holds the rendezvous
    longest, left, completed = 0.0, [], False
    # Counts are not timings: they run side by side, one per core (each its own process), and are taken in order.
    parallel = measure == "count" and coord is None and deadline is None
    ahead = ThreadPoolExecutor(os.cpu_count() or 1) if parallel else None
    counts = {c.key: ahead.submit(run_cell, c, timeout) for c in todo if not done[c.key]} if ahead else {}
    try:
        for r in range(1, rounds + 1):
            for cell in todo:
                planned = rounds if is_timed(cell.kind) else 1
                if r > planned or len(done[cell.key]) >= r or (done[cell.key] and done[cell.key][-1]["status"] != "ok"):
                    continue  # measured once, resumed past this round, or failed earlier: nothing to run
                tag = tags[cell.key] + (f" round {r}/{planned}" if planned > 1 else "")
                if deadline is not None and (left or time.time() + longest > deadline):
                    left.append(tag)
                    continue
                progress(f"{tag}: running ...")
                started = time.time()
                if coord is not None and world_of(cell) > 1:
                    done[cell.key].append(run_cell_on_nodes(cell, timeout, coord, sweep_id, tag))
                elif cell.key in counts:
                    done[cell.key].append(counts.pop(cell.key).result())
                else:
                    done[cell.key].append(run_cell(cell, timeout))
                longest = max(longest, time.time() - started)
                record = _finish(merge(done[cell.key], planned), cell, exp, profile, variant, fp, sweep_id, results_dir)
                m = record.get("metrics") or {}
                shown = ", ".join(f"{k} {m[k]:.4g}" for k in ("throughput", "memory_gb") if isinstance(m.get(k), float))
                progress(f"{tag}: {record['status']} in {time.time() - started:.1f}s{'; ' + shown if shown else ''}")
                if not record["status"].startswith("partial"):
                    try:
                        record["wandb_dir"] = tracking.log_cell(
                            experiment=exp.name,
                            row=cell.row.name,
                            method=cell.row.method,
                            config=cell.resolved(),
                            provenance=record.get("provenance") or {},
                            summary={k: v for k, v in m.items() if k != "history"},
                            status=record["status"],
                            mode=mode,
                            history=m.get("history"),
                        )
                        store.save(results_dir, cell.key, here, record)
                    except Exception as exc:  # noqa: BLE001 — tracking must never lose a measured cell
                        progress(f"{tag}: W&B logging failed: {exc}")
                records[cell.key] = record
                if record["status"] == "error: interrupted":
                    raise KeyboardInterrupt
        completed = True
    finally:
        if ahead is not None:
            ahead.shutdown(cancel_futures=True)
        if coord is not None:
            coord.finish(wait=completed)  # the other nodes stop following
    if left:
        progress(f"deadline reached: {len(left)} cell-round(s) left for the next call (the same command resumes them)")
    pending = {"status": "pending: left at the deadline", "metrics": {}, "provenance": None}
    return cells, [records.get(c.key) or store.load(results_dir, c.key, here) or pending for c in cells]


def _finish(
    record: dict, cell: Cell, exp: Experiment, profile: str, variant: str, fp: dict, sweep: str, results_dir: Path
) -> dict:
    """Label a record with its cell, machine and sweep, and save it under this machine."""
    record.update(
        key=cell.key,
        experiment=exp.name,
        row=cell.row.name,
        method=cell.row.method,
        profile=profile,
        device_type=cell.run.device,
        variant=variant,
        config=cell.resolved(),
        machine=fp,
        sweep=sweep,
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    store.save(results_dir, cell.key, fp["slug"], record)
    return record
