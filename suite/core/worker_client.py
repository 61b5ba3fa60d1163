"""The runner's side of the long-lived cell process (suite.core.worker) that single-rank throughput cells share."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time

from suite.config import paths
from suite.core import interrupts
from suite.core.process import Scratch, cell_env, exit_status, oom_kills, read_outcome
from suite.core.worker import patches_globals
from suite.records.schema import Outcome, failed


class Worker:
    """A long-lived cell process, started when first needed, under the orphan guard and in a session of its own;
    each job timed out like a cell. A worker that dies, or is killed at a timeout, leaves its job one status (`oom`
    where the kernel's OOM killer killed it, `timeout`, or an error naming the signal, with its log's tail) and the
    next job starts a new one."""

    def __init__(self):
        self.tmp = Scratch("worker")
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
            env=cell_env(1),
            cwd=paths.ROOT,
            start_new_session=True,
            text=True,
        )
        self.started += 1

    def run(self, payload: dict, timeout: float, fresh: bool = False) -> Outcome:
        """One cell in the worker; returns its outcome, or the status it gets without one. Where the worker finds
        itself unlike a fresh process (suite.core.isolation), the cell runs in a new worker (`fresh`)."""
        if self.proc is None or interrupts.poll(self.proc) is not None:
            self._start()
        self.jobs += 1
        out_path = os.path.join(self.tmp.name, f"out-{self.jobs}.json")
        log_from = os.path.getsize(self.log_path)
        status, oom_before = None, oom_kills()
        try:
            self.proc.stdin.write(json.dumps({"payload": payload, "out": out_path}, default=str) + "\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            while not os.path.exists(out_path):
                if interrupts.poll(self.proc) is not None:
                    status = exit_status(self.proc.returncode, "worker", oom_before)
                    break
                if time.monotonic() > deadline:
                    status = "timeout"
                    break
                time.sleep(0.02)
        except KeyboardInterrupt:
            status = "error: interrupted"
        except BrokenPipeError:
            status = "error: the worker was gone before its job"
        if status is None and (taint := _tainted(out_path)) and not fresh:
            # an earlier job left the worker unlike a fresh process: this job runs in a new one, and says why
            self.stop()
            outcome = self.run(payload, timeout, fresh=True)
            worker = (outcome.get("provenance") or {}).get("worker")
            if isinstance(worker, dict):
                worker["fresh_because"] = taint
            return outcome
        if status is None:
            outcome, status = read_outcome(out_path)
            if outcome is not None:
                if patches_globals(payload):  # its worker ends after it: the next job starts a fresh one
                    self.stop()
                return outcome
        # A worker that failed a job is not trusted with another; one interrupted or past its time is not waited for.
        self.stop(kill=status in ("error: interrupted", "timeout"))
        with open(self.log_path, errors="replace") as f:
            f.seek(log_from)
            tail = f.read()[-4000:]
        if status == "timeout":
            tail = f"killed at its {timeout:g} s timeout; its log's tail:\n{tail}"
        return failed(status, tail)

    def stop(self, kill: bool = False) -> None:
        """End the worker: its stdin closed, then its session killed if it is still there (at once with `kill`:
        an interrupted job is not waited for)."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            if not kill:
                interrupts.wait_for(self.proc, 10)
        finally:  # an interrupt while it is waited for kills it all the same
            interrupts.kill_session(self.proc)
        self.proc = None
        self.log.close()

    def close(self) -> None:
        self.stop()
        self.tmp.cleanup()


def _tainted(out_path: str) -> list[str] | None:
    """What the worker found unlike a fresh process before a job (suite.core.isolation), where it found anything."""
    try:
        with open(out_path) as f:
            said = json.load(f)
    except (OSError, ValueError):
        return None
    return said.get("worker_tainted") if isinstance(said, dict) else None


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
