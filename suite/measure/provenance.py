"""Provenance recorded with every result: code version, library versions, hardware, cap, profile."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from suite.config.paths import ROOT
from suite.harness import fused_lamb, host_commit, rng
from suite.measure.step import METHODOLOGY_VERSION

# The checkout's code, for `dirty` and for the digest of the whole tree a campaign names what it sent by; a record's
# own code is its cell's (suite.core.cell_code).
CODE_PATHS = ("suite", "baselines", "methods", "experiments", "pyproject.toml")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str | None:
    """The checkout's commit (git's HEAD), or None outside a git checkout."""
    return _git("rev-parse", "HEAD") or None


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def versions() -> tuple[str, str | None]:
    """torch's and transformers' versions as a record's provenance states them."""
    return torch.__version__, _version("transformers")


@functools.cache
def tree_digest() -> str:
    """A digest of the whole tree's code as it is on disk (every file under CODE_PATHS but caches), git or no git: how
    a campaign names the snapshot it sends (a copy hashes alike; any edit does not). Not a record's code, which is
    its cell's files only (suite.core.cell_code)."""
    h = hashlib.sha256()
    for top in CODE_PATHS:
        root = Path(ROOT) / top
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for f in files:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".so", ".o"):
                h.update(f.relative_to(Path(ROOT)).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "device": props.name,
            "device_memory_gb": props.total_memory / 1e9,
            "device_count": torch.cuda.device_count(),
        }
    return {
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "device_memory_gb": None,
        "device_count": 1,
    }


def provenance(device: torch.device, profile: str, cap: int | None, code: dict | None = None) -> dict:
    """Everything needed to tell where and how a number was obtained; `code`: the cell's (suite.core.cell_code.code_of:
    its digest and files)."""
    # A launcher that copied the tree to another machine (the GPU campaign) states what it sent: the .git
    # that travels with such a copy can be stale, so its word wins over git's there.
    commit, source = os.environ.get("SUITE_COMMIT", ""), "SUITE_COMMIT"
    if commit:
        dirty = {"0": False, "1": True}.get(os.environ.get("SUITE_DIRTY", ""))
    else:
        commit, source = _git("rev-parse", "HEAD"), "git"
        # Code paths only, untracked files included: results/ changes as runs land and is not code.
        dirty = bool(_git("status", "--porcelain", "--", *CODE_PATHS)) if commit else None
    return {
        "commit": commit or None,
        "dirty": dirty if commit else None,
        "commit_from": source if commit else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "host": platform.node(),
        **device_info(device),
        "device_memory_cap_gb": cap / 1e9 if cap else None,
        "profile": profile,
        "methodology": METHODOLOGY_VERSION,
        "code": None,
        **(code or {}),
        "threads": torch.get_num_threads(),
        "harness": harness(),
    }


def harness() -> dict:
    """What the harness ran with in this process: the keyed dropout's paths (with any fallback's reason) and the
    host LAMB's kernel and L2L-CMP's host commit, where one was asked for."""
    out: dict = {"dropout": rng.used()}
    lamb = fused_lamb.status()
    if lamb is not None:
        out["host_lamb"] = lamb
    commit = host_commit.status()
    if commit is not None:
        out["host_commit"] = commit
    return out
