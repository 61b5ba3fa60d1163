"""What this host offers a process: its usable memory."""

from __future__ import annotations

import os


def ram_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when that is lower (what a process here can actually use); where
    /proc says nothing, what sysconf does; None when neither does."""
    total = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except OSError:
        pass
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = open(path).read().strip()
        except OSError:
            continue
        if raw.isdigit() and (total is None or int(raw) < total):
            total = int(raw)
    return total
