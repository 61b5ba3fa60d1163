"""Launch a module on N ranks with torchrun (this machine's, or this node's share of several), in its own session so
a timeout kills every rank."""

from __future__ import annotations

import os
import signal
import subprocess

from suite.config.launch import Nodes, torchrun_command
from suite.config.paths import ROOT


def torchrun(
    nproc: int, module: str, args: list[str], timeout: float, threads: int = 1, nodes: Nodes | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m module *args` on `nproc` ranks (standalone, or across `nodes`); returns the completed process
    (stdout and stderr captured as text). On timeout the whole process group is killed and TimeoutExpired re-raised."""
    cmd = torchrun_command(nproc, module, args, nodes)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
