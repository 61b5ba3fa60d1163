"""Runs an experiment's cells in fresh processes that die with the runner, in interleaved rounds, cached per machine."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.launch import torchrun_command
from suite.core import registry
from suite.core.cell import TIMED, check_cells
from suite.core.experiment import Cell, Experiment, resolve_profile
from suite.core.rounds import merge
from suite.measure.machine import fingerprint
from suite.records import store, tracking


def _command(cell: Cell, cfg_path: str, out_path: str) -> list[str]:
    guard = [sys.executable, "-m", "suite.core.orphans", str(os.getpid())]  # dies with this runner
    world = registry.get(cell.run.method).world_size(cell.run)
    if world > 1:  # torchrun also spans several machines when launched there
        return guard + torchrun_command(world, "suite.core.cell", [cfg_path, out_path])
    return guard + [sys.executable, "-m", "suite.core.cell", cfg_path, out_path]


def run_cell(cell: Cell, timeout: float | None = None) -> dict:
    """Run one cell in a subprocess; returns its record with exactly one status."""
    timeout = cell.timeout if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="suite-cell-") as tmp:
        cfg_path, out_path, log_path = (os.path.join(tmp, n) for n in ("cell.json", "out.json", "log.txt"))
        with open(cfg_path, "w") as f:
            json.dump(cell.resolved(), f, default=str)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [paths.ROOT, os.environ.get("PYTHONPATH")]))}
        # One OpenMP team per core across the cell's ranks: oversubscribed teams spin and can make a
        # small CPU step tens of times slower. An explicit OMP_NUM_THREADS wins.
        world = registry.get(cell.run.method).world_size(cell.run)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
        with open(log_path, "w") as log:
            # A new session so that a timeout kills the cell and every rank it started.
            proc = subprocess.Popen(
                _command(cell, cfg_path, out_path),
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
                return json.load(f)
        if status is None:
            status = f"error: cell process exited with code {proc.returncode} without a record"
            if proc.returncode and proc.returncode < 0 and -proc.returncode == signal.SIGKILL:
                status = "oom"  # killed by the kernel's OOM killer
        return {"status": status, "metrics": {}, "error": log_tail, "provenance": None}


def variant_of(overrides: list[str] | None, device_memory: str | None) -> str:
    """What makes a run differ from the experiment's default at its profile (empty for the default)."""
    parts = [f"device_memory={device_memory}"] if device_memory else []
    return ", ".join(parts + [f"set {o}" for o in overrides or []])


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
) -> tuple[list[Cell], list[dict]]:
    """Run (or reuse) every cell of `exp` on this machine, write one record and one W&B run per cell; returns
    (cells, records). Throughput cells run `rounds` times (the experiment's default), the cells of one round
    after another (ABC ABC ABC) so that drift hits all alike. A record is reused only on the machine that made it.

    The tables are the face's to render (suite.sweep): the engine stands below the reports."""
    results_dir = Path(results_dir or paths.RESULTS_DIR)
    profile = resolve_profile(profile)
    rounds = exp.rounds if rounds is None else rounds
    if rounds < 1:
        raise ConfigError(f"--rounds {rounds}: give 1 or more timing rounds (3 or more to see the noise)")
    mode = tracking.resolve_mode(wandb_mode)
    cells = exp.cells(profile, only, overrides, device_memory)
    check_cells(cells)
    variant = variant_of(overrides, device_memory)
    fp = fingerprint()
    here, sweep_id = fp["slug"], new_sweep_id()
    tags = {
        c.key: f"[{i}/{len(cells)}] {exp.name}/{c.row.name} ({c.row.method}, {profile})" for i, c in enumerate(cells, 1)
    }
    records: dict[str, dict] = {}
    todo = []
    for cell in cells:
        cached = store.load(results_dir, cell.key, here, warn=progress)
        if cached and cached["status"] in store.FINISHED and not force:
            progress(f"{tags[cell.key]}: {cached['status']} (cached on {here}, {cell.key})")
            records[cell.key] = cached
        elif not registry.is_registered(cell.row.method):
            error = f"method {cell.row.method!r} is not registered yet"
            record = {"status": "not_implemented", "metrics": {}, "error": error, "provenance": None}
            records[cell.key] = _finish(record, cell, exp, profile, variant, fp, sweep_id, results_dir)
        else:
            todo.append(cell)
    if todo:
        progress(
            f"measuring {len(todo)} cell(s) on {here}, sweep {sweep_id}: throughput cells in {rounds} "
            "interleaved round(s)"
        )
    done: dict[str, list[dict]] = {c.key: [] for c in todo}
    for r in range(1, rounds + 1):
        for cell in todo:
            planned = rounds if cell.kind in TIMED else 1
            if r > planned or (done[cell.key] and done[cell.key][-1]["status"] != "ok"):
                continue  # measured once, or failed in an earlier round: its record is already final
            tag = tags[cell.key] + (f" round {r}/{planned}" if planned > 1 else "")
            progress(f"{tag}: running ...")
            started = time.time()
            done[cell.key].append(run_cell(cell, timeout))
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
                        summary=m,
                        status=record["status"],
                        mode=mode,
                    )
                    store.save(results_dir, cell.key, here, record)
                except Exception as exc:  # noqa: BLE001 — tracking must never lose a measured cell
                    progress(f"{tag}: W&B logging failed: {exc}")
            records[cell.key] = record
            if record["status"] == "error: interrupted":
                raise KeyboardInterrupt
    return cells, [records[c.key] for c in cells]


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
