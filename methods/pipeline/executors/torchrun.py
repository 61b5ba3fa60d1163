"""Launch a module on N local ranks with torchrun, in its own session so a timeout kills every rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from suite.config.paths import ROOT


def torchrun(nproc: int, module: str, args: list[str], timeout: float, threads: int = 1) -> subprocess.CompletedProcess:
    """Run `python -m module *args` on `nproc` ranks; returns the completed process (stdout and stderr
    captured as text). On timeout the whole process group is killed and TimeoutExpired re-raised."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *args,
    ]
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
