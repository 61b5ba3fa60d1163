"""The processes of a session, read from /proc: what the contention watcher counts and a killed build kills."""

from __future__ import annotations

import os


def session_ticks(sid: int) -> dict[int, int] | None:
    """CPU clock ticks (user + system) of every live process in session `sid`, by pid; None without /proc."""
    if not os.path.isdir("/proc"):
        return None
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        rest = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
        if int(rest[3]) == sid:  # field 6, the session
            out[int(name)] = int(rest[11]) + int(rest[12])  # fields 14 and 15: utime, stime
    return out


def proc_counter(path: str, name: str) -> int | None:
    """The number on the line of `path` that starts with `name` (`/proc/stat`'s procs_running, `/proc/vmstat`'s
    oom_kill), None where the file or the line cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + " "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None
