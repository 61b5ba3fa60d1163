"""Probe for the counted-against-measured gap on a GPU (tests/test_counting_cuda.py): what CUDA's allocator holds at
a cell's peak that the count does not model.

For each of the test's cells (the rows given, else all four): the cell measured in this process with the
allocator's history recorded (Python stacks), then its count (fake tensors, on the host); the history is replayed to
the moment of the peak and the blocks alive there are grouped by where they were allocated (the innermost frame in
the suite's own code, and the outermost frame of torch or a library where the suite's code is not on the stack).
Writes one JSON file: per cell, the counted and measured peaks, the replayed peak, and the groups by bytes.

    python tests/probes/cuda_peak_sites.py OUT.json [ROW ...]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import defaultdict

import torch

from suite.commands.campaign.stages import counted_cells
from suite.core.cell import execute

OURS = ("/suite/", "/methods/", "/baselines/", "/experiments/")


def site(frames: list[dict]) -> str:
    """Where a block was allocated: the innermost frame of our code with the frame it called, else the top frame."""
    for i, f in enumerate(frames):
        if any(p in f["filename"] for p in OURS):
            callee = frames[i - 1] if i else None
            inner = f" -> {os.path.basename(callee['filename'])}:{callee['name']}" if callee else ""
            return f"{f['filename'].split('/')[-2]}/{os.path.basename(f['filename'])}:{f['line']} {f['name']}{inner}"
    if frames:
        f = frames[0]
        return f"(no suite frame) {os.path.basename(f['filename'])}:{f['line']} {f['name']}"
    return "(no Python frame: allocated by C++ alone)"


def peak_sites(snapshot: dict, device: int = 0) -> dict:
    """Replay the device's trace (alloc +size, free_requested -size, as the allocated-bytes statistic moves) to its
    peak; group the blocks alive there by site and size."""
    live: dict[int, tuple[int, list[dict]]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, list[dict]]] = {}
    events = snapshot["device_traces"][device]
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    # Blocks allocated before the history started (none when it starts first) appear in the segments only.
    before = sum(
        b["size"]
        for seg in snapshot["segments"]
        if seg["device"] == device
        for b in seg["blocks"]
        if b["state"] == "active_allocated" and not b.get("frames")
    )
    groups: dict[str, dict] = defaultdict(lambda: {"bytes": 0, "blocks": 0, "sizes": defaultdict(int)})
    for size, frames in at_peak.values():
        g = groups[site(frames)]
        g["bytes"] += size
        g["blocks"] += 1
        g["sizes"][str(size)] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])
    return {
        "events": len(events),
        "replayed_peak": peak,
        "live_without_history": before,
        "groups": [{"site": k, **{**v, "sizes": dict(v["sizes"])}} for k, v in ranked],
    }


def main(argv: list[str]) -> int:
    out, rows = argv[0], set(argv[1:]) or {c.row.name for c in counted_cells()}
    report: dict = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("CUBLAS", "PYTORCH_", "CUDA_"))},
        "cells": {},
    }
    for cell in counted_cells():
        if cell.row.name not in rows:
            continue
        # A fresh process's cell allocates cuBLAS's workspaces itself: free the ones an earlier cell made.
        if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=2_000_000)
        measured = execute(dataclasses.replace(cell, kind="throughput").resolved())
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        counted = execute(dataclasses.replace(cell, kind="count").resolved())  # on the host, after the device's run
        entry = {
            "counted": counted["metrics"].get("device_peak_allocated"),
            "counted_breakdown": counted["metrics"].get("device_breakdown"),
            "measured": measured["metrics"].get("device_peak_allocated"),
            "status": [counted["status"], measured["status"]],
            **peak_sites(snapshot),
            "segments_at_end": sum(s["total_size"] for s in snapshot["segments"]),
        }
        report["cells"][cell.row.name] = entry
        print(cell.row.name, {k: entry[k] for k in ("counted", "measured", "replayed_peak", "status")}, flush=True)
        for g in entry["groups"][:8]:
            print(f"  {g['bytes'] / 2**20:9.1f} MiB {g['blocks']:5d} blocks  {g['site']}", flush=True)
        torch.cuda.empty_cache()
        with open(out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
