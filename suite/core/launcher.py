"""Starts a cell's processes: one, or torchrun's ranks on this machine or this node's share of several, each in
a session of its own that dies with the runner; returns the record the cell wrote or the status it gets without one."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite.config import paths
from suite.config.launch import Nodes, torchrun_command
from suite.core import registry
from suite.core.experiment import Cell
from suite.core.kinds import kind
from suite.core.nodes import Coordinator
from suite.harness.model import shape_key
from suite.records.schema import Outcome, problems


def _command(world: int, cfg_path: str, out_path: str, nodes: Nodes | None, rdzv_id: str | None) -> list[str]:
    guard = [sys.executable, "-m", "suite.core.orphans", str(os.getpid())]  # dies with this runner
    if world > 1:  # this machine's ranks, or this node's share of them (node 0's sweep holds the rendezvous store)
        return guard + torchrun_command(world, "suite.core.cell", [cfg_path, out_path], nodes, rdzv_id, store_held=True)
    return guard + [sys.executable, "-m", "suite.core.cell", cfg_path, out_path]


def _env(ranks_here: int) -> dict:
    """A cell process's environment: the tree on its path, and one OpenMP team per core across this machine's
    ranks (oversubscribed teams spin and can make a small CPU step tens of times slower; an explicit
    OMP_NUM_THREADS wins)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [paths.ROOT, os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks_here)))
    return env


def world_of(cell: Cell) -> int:
    """How many ranks the cell runs on (through torchrun when more than one); a count takes every rank in one."""
    if kind(cell.kind).one_process:
        return 1
    return registry.get(cell.run.method).world_size(cell.run) if registry.is_registered(cell.run.method) else 1


_running: set[subprocess.Popen] = set()  # cell processes of this runner now running (counts run several at once)


def kill_running() -> None:
    """Kill every cell process this runner has running, each with its session (an interrupted sweep's counts)."""
    for proc in list(_running):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_cell(cell: Cell, timeout: float | None = None) -> Outcome:
    """Run one cell in a subprocess on this machine; returns its record with exactly one status."""
    record, failure = launch(cell.resolved(), world_of(cell), cell.timeout if timeout is None else timeout)
    return record or failure


def launch(
    payload: dict, world: int, timeout: float, nodes: Nodes | None = None, rdzv_id: str | None = None
) -> tuple[Outcome | None, Outcome]:
    """Run the cell `payload` (Cell.resolved()) on `world` ranks, this node's share of them when `nodes` spans
    several. Returns (rank 0's record if it was written on this node, else None; the record the cell gets
    without it: `timeout`, `oom` when the kernel killed it, or an error with the log's tail)."""
    with tempfile.TemporaryDirectory(prefix="suite-cell-") as tmp:
        cfg_path, out_path, log_path = (os.path.join(tmp, n) for n in ("cell.json", "out.json", "log.txt"))
        with open(cfg_path, "w") as f:
            json.dump(payload, f, default=str)
        here = nodes.ranks_per_node(world) if nodes is not None and world > 1 else world
        env = _env(here)
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
            _running.add(proc)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = "timeout"
            except KeyboardInterrupt:
                status = "error: interrupted"
            finally:
                _running.discard(proc)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        log_tail = Path(log_path).read_text(errors="replace")[-4000:]
        if status is None and os.path.exists(out_path):
            outcome, status = _read(out_path)
            if outcome is not None:
                return outcome, {}
        if status is None:
            status = _exit_status(proc.returncode, "cell process")
        return None, {"status": status, "metrics": {}, "error": log_tail, "provenance": None}


def _exit_status(code: int | None, what: str) -> str:
    """The status of a process that ended without a record: `oom` when SIGKILL ended it (the kernel's OOM killer)."""
    if code is not None and code < 0 and -code == signal.SIGKILL:
        return "oom"
    return f"error: {what} exited with code {code} without a record"


def _read(out_path: str) -> tuple[Outcome | None, str | None]:
    """The outcome a cell process wrote, or the error status of one that does not match the record schema."""
    with open(out_path) as f:
        outcome = json.load(f)
    if not (wrong := problems(outcome, Outcome)):
        return outcome, None
    return None, f"error: the cell's outcome does not match the record schema: {', '.join(wrong)}"[:300]


class Worker:
    """The runner's side of a long-lived cell process (suite.core.worker) for single-rank throughput cells: started
    when first needed, under the orphan guard and in a session of its own; each job timed out like a cell. A worker
    that dies, or is killed at a timeout, leaves its job one status (`oom` where the kernel killed it, `timeout`, or
    an error with its log's tail) and the next job starts a new one."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="suite-worker-")
        self.proc: subprocess.Popen | None = None
        self.jobs = self.started = 0
        self.log_path = os.path.join(self.tmp.name, "log.txt")

    def _start(self) -> None:
        self.log = open(self.log_path, "a")
        guard = [sys.executable, "-m", "suite.core.orphans", str(os.getpid())]
        self.proc = subprocess.Popen(
            guard + [sys.executable, "-m", "suite.core.worker"],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=_env(1),
            cwd=paths.ROOT,
            start_new_session=True,
            text=True,
        )
        self.started += 1

    def run(self, payload: dict, timeout: float) -> Outcome:
        """One cell in the worker; returns its outcome, or the status it gets without one."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.jobs += 1
        out_path = os.path.join(self.tmp.name, f"out-{self.jobs}.json")
        log_from = os.path.getsize(self.log_path)
        status = None
        try:
            self.proc.stdin.write(json.dumps({"payload": payload, "out": out_path}, default=str) + "\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            while not os.path.exists(out_path):
                if self.proc.poll() is not None:
                    status = _exit_status(self.proc.returncode, "worker")
                    break
                if time.monotonic() > deadline:
                    status = "timeout"
                    break
                time.sleep(0.02)
        except KeyboardInterrupt:
            status = "error: interrupted"
        except BrokenPipeError:
            status = "error: the worker was gone before its job"
        if status is None:
            outcome, status = _read(out_path)
            if outcome is not None:
                return outcome
        self.stop(kill=status == "error: interrupted")  # a worker that failed a job is not trusted with another
        with open(self.log_path, errors="replace") as f:
            f.seek(log_from)
            tail = f.read()[-4000:]
        return {"status": status, "metrics": {}, "error": tail, "provenance": None}

    def stop(self, kill: bool = False) -> None:
        """End the worker: its stdin closed, then its session killed if it is still there (at once with `kill`:
        an interrupted job is not waited for)."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=0 if kill else 10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self.log.close()

    def close(self) -> None:
        self.stop()
        self.tmp.cleanup()


_shared: Worker | None = None


def shared_worker() -> Worker:
    """The worker every sweep of this runner shares (a campaign's stages, one sweep after another), started when
    first needed; close_shared_worker ends it (it dies with the runner in any case)."""
    global _shared
    if _shared is None:
        _shared = Worker()
        atexit.register(close_shared_worker)
    return _shared


def close_shared_worker() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


def shape_of(cell: Cell) -> str:
    """What the worker's pool keeps one of at a time: the model's shape (suite.harness.model.ModelPool)."""
    return shape_key(cell.run.model)


def by_shape(cells: list[Cell], r: int = 1) -> list[Cell]:
    """Round `r`'s cells grouped by model shape, in the plan's order within each group and the groups in the order
    of their first cells, reversed in even rounds, so that the worker's pool builds each shape once a round at most
    and a round begins with the shape the last one ended with."""
    first: dict[str, int] = {}
    order = sorted(cells, key=lambda c: first.setdefault(shape_of(c), len(first)))
    if r % 2:
        return order
    return sorted(order, key=lambda c: -first[shape_of(c)])


def pooled(cell: Cell) -> bool:
    """Whether a cell may run in a worker: a single-rank timed cell of one of our methods or of a peer whose
    library keeps no process-wide state but its process group (Method.shares_worker; several ranks need their own
    processes; the benchmarks and counts keep theirs)."""
    if not (kind(cell.kind).timed and world_of(cell) == 1 and registry.is_registered(cell.run.method)):
        return False
    method = registry.get(cell.run.method)
    return method.peer is None if method.shares_worker is None else method.shares_worker


def run_cell_on_nodes(cell: Cell, timeout: float | None, coord: Coordinator, sweep_id: str, tag: str) -> Outcome:
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
