"""The record store: one JSON record per cell under results/runs/<key>.json, written atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

FINISHED = ("ok", "oom")  # a re-run skips these; error, timeout and not_implemented are tried again


def run_path(results_dir: Path, key: str) -> Path:
    return results_dir / "runs" / f"{key}.json"


def load(results_dir: Path, key: str) -> dict | None:
    path = run_path(results_dir, key)
    if not path.exists():
        return None
    with open(path) as f:
        return json.load(f)


def save(results_dir: Path, key: str, record: dict) -> Path:
    """Write atomically, so an interrupted sweep never leaves a half-written record."""
    path = run_path(results_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path
