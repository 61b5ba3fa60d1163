"""Ctrl-C and SIGTERM as KeyboardInterrupt, never inside a child's wait.

Python raises KeyboardInterrupt wherever the main thread is when the signal arrives. Inside subprocess's
`poll`/`wait` that can be between taking the Popen's wait lock and the `try` that frees it: the lock stays taken,
and the next `wait()` (the one that reaps the killed cell) blocks for ever. Seen in CI: a SIGTERM'd runner printed
its one line and never exited. So the runner's handlers (`install`) hold a signal that arrives inside `shielded()`
until the shield ends, and every poll of a cell process here goes through `poll`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

_depth = [0]  # how many shields are open in the main thread
_held: list[int] = []  # signals that arrived inside one, raised when the last closes


def _raise(signum, frame):
    if _depth[0]:
        _held.append(signum)
        return
    _held.clear()
    raise KeyboardInterrupt


def install() -> dict:
    """SIGINT and SIGTERM raise KeyboardInterrupt, held inside a shield; returns the handlers they replace (for
    `restore`). Main thread only."""
    return {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}


def restore(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


@contextlib.contextmanager
def shielded():
    """A block no Ctrl-C or SIGTERM breaks into: one that arrives meanwhile is raised as it ends. (Signals reach
    the main thread only: elsewhere, as in the threads that run counts side by side, it shields nothing.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0] and _held:
            _held.clear()
            raise KeyboardInterrupt


def poll(proc: subprocess.Popen) -> int | None:
    """`proc.poll()`, shielded (its wait lock is never left taken)."""
    with shielded():
        return proc.poll()


def wait_for(proc: subprocess.Popen, timeout: float | None = None) -> int | None:
    """Wait for `proc` to end, at most `timeout` seconds (None: no limit); returns its exit code, or None at the
    limit. Interruptible between polls, never inside one."""
    end = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while (code := poll(proc)) is None:
        if end is not None and time.monotonic() >= end:
            return None
        time.sleep(delay if end is None else max(min(delay, end - time.monotonic()), 0))
        delay = min(delay * 2, 0.05)
    return code


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s session (it was started in one of its own) if it is still running, and reap it. The poll
    and the kill are one shielded step: a second Ctrl-C is raised after the kill, never between them."""
    with shielded():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    wait_for(proc)
