"""Cell processes die with the runner: the parent-death signal, set before exec and again by each torchrun rank.

    python -m suite.core.orphans RUNNER_PID COMMAND...

A runner killed with SIGKILL cannot clean up, so each cell process asks the kernel for SIGKILL when its
parent dies (PR_SET_PDEATHSIG, kept across exec); a cell launched under torchrun has each rank ask the same
of torchrun. No cell outlives its runner, so none can finish later and leave a record behind it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Get SIGKILL when the parent process dies; exit now if it already has (Linux only, else a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before the signal was armed


def main(argv: list[str]) -> None:
    die_with_parent(int(argv[0]))
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
