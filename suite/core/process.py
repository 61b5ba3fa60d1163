"""Starts a cell's processes: one, or torchrun's ranks on this machine or this node's share of several, each in
a session of its own that dies with the runner; returns the record the cell wrote or the status it gets without one."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite.config import paths
from suite.config.launch import Nodes, torchrun_command
from suite.core import interrupts
from suite.harness.processes import proc_counter
from suite.records.schema import Outcome, failed, problems


def _command(world: int, cfg_path: str, out_path: str, nodes: Nodes | None, rdzv_id: str | None) -> list[str]:
    guard = [sys.executable, "-m", "suite.core.orphans", str(os.getpid())]  # dies with this runner
    if world > 1:  # this machine's ranks, or this node's share of them (node 0's sweep holds the rendezvous store)
        return guard + torchrun_command(world, "suite.core.cell", [cfg_path, out_path], nodes, rdzv_id, store_held=True)
    return guard + [sys.executable, "-m", "suite.core.cell", cfg_path, out_path]


def cell_env(ranks_here: int) -> dict:
    """A cell process's environment: the tree on its path, and one OpenMP team per core across this machine's
    ranks (oversubscribed teams spin and can make a small CPU step tens of times slower; an explicit
    OMP_NUM_THREADS wins)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [paths.ROOT, os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks_here)))
    return env


HELD = "held.lock"  # in each scratch folder, locked (flock) by the runner using it for as long as it does
ORPHAN_AGE_S = 60.0  # a folder younger than this is never taken for an orphan (its lock may not be taken yet)


class Scratch:
    """A runner's scratch folder (a cell's files, the worker's), held under a lock the kernel keeps for the runner's
    process: when the runner dies, however (SIGKILL cleans up nothing), the lock is free and the next runner's
    remove_orphaned_scratch removes the folder, in any process namespace and whatever became of its pid."""

    def __init__(self, kind: str):
        self.name = tempfile.mkdtemp(prefix=f"suite-{kind}-")
        self._held = open(os.path.join(self.name, HELD), "w")
        fcntl.flock(self._held, fcntl.LOCK_EX)

    def cleanup(self) -> None:
        self._held.close()
        shutil.rmtree(self.name, ignore_errors=True)

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc) -> None:
        self.cleanup()


def remove_orphaned_scratch() -> list[Path]:
    """Remove the scratch folders of runners that are gone (their lock free), each at least ORPHAN_AGE_S old."""
    removed = []
    for folder in [
        *Path(tempfile.gettempdir()).glob("suite-cell-*"),
        *Path(tempfile.gettempdir()).glob("suite-worker-*"),
    ]:
        try:
            if time.time() - folder.stat().st_mtime < ORPHAN_AGE_S or not (folder / HELD).exists():
                continue
            with open(folder / HELD) as held:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # taken: no runner holds it
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held (BlockingIOError), another user's, or gone meanwhile
            continue
        removed.append(folder)
    return removed


_running: set[subprocess.Popen] = set()  # cell processes of this runner now running (counts run several at once)


def kill_running() -> None:
    """Kill every cell process this runner has running, each with its session (an interrupted sweep's counts)."""
    for proc in list(_running):
        if interrupts.poll(proc) is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def launch(
    payload: dict, world: int, timeout: float, nodes: Nodes | None = None, rdzv_id: str | None = None
) -> tuple[Outcome | None, Outcome]:
    """Run the cell `payload` (Cell.resolved()) on `world` ranks, this node's share of them when `nodes` spans
    several. Returns (rank 0's record if it was written on this node, else None; the record the cell gets
    without it: `timeout`, `oom` when the kernel's OOM killer killed it, or an error with the log's tail)."""
    with Scratch("cell") as tmp:
        cfg_path, out_path, log_path = (os.path.join(tmp, n) for n in ("cell.json", "out.json", "log.txt"))
        with open(cfg_path, "w") as f:
            json.dump(payload, f, default=str)
        here = nodes.ranks_per_node(world) if nodes is not None and world > 1 else world
        oom_before = oom_kills()
        with open(log_path, "w") as log:
            # A new session so that a timeout kills the cell and every rank it started.
            proc = subprocess.Popen(
                _command(world, cfg_path, out_path, nodes, rdzv_id),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cell_env(here),
                cwd=paths.ROOT,
                start_new_session=True,
            )
            status = None
            _running.add(proc)
            try:
                if interrupts.wait_for(proc, timeout) is None:
                    status = "timeout"
            except KeyboardInterrupt:
                status = "error: interrupted"
            finally:
                interrupts.kill_session(proc)
                _running.discard(proc)  # after the kill: an interrupt inside it leaves it to kill_running
        log_tail = Path(log_path).read_text(errors="replace")[-4000:]
        if status is None and os.path.exists(out_path):
            outcome, status = read_outcome(out_path)
            if outcome is not None:
                return outcome, {}
        if status is None:
            status = exit_status(proc.returncode, "cell process", oom_before)
        elif status == "timeout":
            log_tail = f"killed at its {timeout:g} s timeout; its log's tail:\n{log_tail}"
        return None, failed(status, log_tail)


VMSTAT = "/proc/vmstat"  # its `oom_kill` line: every kill of the kernel's OOM killer, a cgroup's limit's included


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (Linux 4.13 and later), None where that
    cannot be read: the evidence a SIGKILL needs to be called out-of-memory."""
    return proc_counter(VMSTAT, "oom_kill")


def exit_status(code: int | None, what: str, oom_before: int | None) -> str:
    """The status of a process that ended without a record: `oom` only where SIGKILL ended it while the kernel's
    OOM killer counted a kill (`oom_before`: its count when the process started); any other signal or a SIGKILL
    without that evidence (a user's kill -9, a scheduler, a wrapper's timeout) is an error naming the signal,
    which the same command measures again."""
    if code is None or code >= 0:
        return f"error: {what} exited with code {code} without a record"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    now = oom_kills()
    if -code == signal.SIGKILL and oom_before is not None and now is not None and now > oom_before:
        return "oom"
    why = "the kernel counted no out-of-memory kill" if now is not None else "the kernel's OOM count is unreadable"
    return f"error: {what} killed by {name} ({why}: not out of memory; the same command measures it again)"


def read_outcome(out_path: str) -> tuple[Outcome | None, str | None]:
    """The outcome a cell process wrote, or the error status of one that does not match the record schema."""
    with open(out_path) as f:
        outcome = json.load(f)
    if not (wrong := problems(outcome, Outcome)):
        return outcome, None
    return None, f"error: the cell's outcome does not match the record schema: {', '.join(wrong)}"[:300]
