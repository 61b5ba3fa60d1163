"""The campaign's pytest steps: the tests that need CUDA, counted against measured, L2L's microbenchmarks, each run
in a pytest process of its own with a time limit, its counts read from its JUnit report."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from suite.config import paths

# The tests that need CUDA: equivalence at FP32 (TF32 off), L2L-CMP, the copy/compute overlap seen by CUDA
# events, pinned asynchronous copies, the emulated cap's OOM recorded as `oom`, NCCL where two GPUs exist; the
# Triton kernels (keyed dropout, attention, device LAMB) compiled and held to their eager references.
CUDA_TESTS = (
    "tests/test_cuda_kernels.py",
    "tests/test_device_lamb.py",
    "tests/test_cuda.py",
    "tests/l2l/test_l2l_cuda.py",
    "tests/pipeline/test_pipeline_exec_cuda.py",
    "tests/test_campaign_cuda.py",
)
COUNTED_TESTS = ("tests/test_counting_cuda.py",)  # counted against CUDA's allocator, in stage 1
BENCH_TESTS = ("tests/l2l/test_l2l_bench.py",)  # pytest-benchmark: the host update per parameter, an L2L step on CUDA
JUNIT = {"failure": "failed", "error": "errors", "skipped": "skipped"}


def run_pytest(files: tuple[str, ...], marker: str, report: Path, extra: list[str], budget: float) -> dict:
    """Run pytest on `files` with `marker`; returns the counts from its junit report and its tail."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", marker, f"--junitxml={report}", *extra, *files]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=max(budget, 30.0))
        tail, code = (proc.stdout + proc.stderr)[-6000:], proc.returncode
    except subprocess.TimeoutExpired as exc:
        tail, code = f"timeout after {budget:.0f}s: {str(exc.stdout or '')[-3000:]}", "timeout"
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if report.exists():
        import xml.etree.ElementTree as ET

        for case in ET.parse(report).getroot().iter("testcase"):
            kids = {child.tag for child in case}
            # JUnit marks a case by its child element; none means it passed.
            counts[next((JUNIT[tag] for tag in JUNIT if tag in kids), "passed")] += 1
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", tail)
    counts["collected"] = int(collected.group(1)) if collected else None
    return {"command": " ".join(cmd), "exit": code, "seconds": round(time.time() - started, 1), **counts, "tail": tail}
