"""Files the suite writes whole: records, tables, figures, reports. Each is written to a temporary file of its own
beside the target and renamed over it, so a reader never sees half of one and two writers never share a temporary
file (the last rename wins, each file whole)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write `data` to `path` atomically (its folder made where missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared results folder's files from its other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_object(path: Path | str) -> dict | None:
    """The JSON object stored at `path`; None where there is none, or where what is there is not one (a file cut
    short by a killed writer, another shape): a cache or a stored count read so is made again, never half-trusted."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
