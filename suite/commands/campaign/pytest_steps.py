"""The campaign's pytest steps: the tests that need CUDA, counted against measured, L2L's microbenchmarks, each run
in a pytest process of its own with a time limit, its counts read from its JUnit report."""

from __future__ import annotations

import os
import re
import signal
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
# Tuning the attention's tiles for every shape the tests launch took the H100 285 s for 17 tests (2026-11-27): the
# cuda tests run with fixed tiles (SUITE_TRITON_TUNE=0), and the attention at BERT-Large's head shape, the tables'
# own, once more with its tiles tuned as the tables' cells run it.
TUNED_TESTS, TUNED_K = ("tests/test_cuda_kernels.py",), "bert_larges_head_shape"
COUNTED_TESTS = ("tests/test_counting_cuda.py",)  # counted against CUDA's allocator, in stage 1
BENCH_TESTS = ("tests/l2l/test_l2l_bench.py",)  # pytest-benchmark: the host update per parameter, an L2L step on CUDA
JUNIT = {"failure": "failed", "error": "errors", "skipped": "skipped"}
MIN_S = 30.0  # the least a pytest step is given, whatever its budget
INTERRUPT_GRACE_S = 15.0  # kept inside the budget: the SIGINT comes that long before it, for pytest to report


def _interruptible() -> None:
    """In the child before it starts: SIGINT back to its default. A command started in the background without job
    control (`cmd &`, nohup, a remote runner) has SIGINT ignored, the child inherits that through exec, and Python
    then leaves it ignored: pytest never saw the interrupt, was killed after the grace and wrote no report (every
    full test run started so failed its step test)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_pytest(
    files: tuple[str, ...], marker: str, report: Path, extra: list[str], budget: float, env: dict | None = None
) -> dict:
    """Run pytest on `files` with `marker` (and `env` over this process's environment); returns the counts from
    the JUnit report this run wrote, its exit, seconds and tail. At the time limit pytest is interrupted (SIGINT),
    so that it reports the tests it finished; a report left by an earlier run is removed first, never read as this
    one's (no report: the counts are None)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", marker, f"--junitxml={report}", *extra, *files]
    path = os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))
    report.unlink(missing_ok=True)
    started = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=paths.ROOT,
        env={**os.environ, **(env or {}), "PYTHONPATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_interruptible,
    )  # fmt: skip (a session of its own: the processes its tests start end with it)
    try:
        out, code = proc.communicate(timeout=max(budget - INTERRUPT_GRACE_S, MIN_S))[0], proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # pytest stops, reports what ran and writes its JUnit file
        try:
            out = proc.communicate(timeout=INTERRUPT_GRACE_S)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0]
        out, code = f"timeout after {budget:.0f}s:\n{out}", "timeout"
    counts: dict = {"passed": None, "failed": None, "skipped": None, "errors": None}
    if report.exists():
        import xml.etree.ElementTree as ET

        counts = dict.fromkeys(counts, 0)
        for case in ET.parse(report).getroot().iter("testcase"):
            if case.get("name") is None:  # the test an interrupt stopped: a bare entry, neither passed nor failed
                continue
            kids = {child.tag for child in case}
            # JUnit marks a case by its child element; none means it passed.
            counts[next((JUNIT[tag] for tag in JUNIT if tag in kids), "passed")] += 1
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", out)
    counts["collected"] = int(collected.group(1)) if collected else None
    tail = out[-6000:]
    return {"command": " ".join(cmd), "exit": code, "seconds": round(time.time() - started, 1), **counts, "tail": tail}


def run_cuda_tests(here: Path, extra: list[str], deadline: float) -> dict:
    """The cuda tests with fixed tiles, then the tuned one where the first run was not cut at the deadline: one
    report of both (`cuda-tests.xml`, `cuda-tests-tuned.xml`), counts summed, the first exit that is not 0."""
    fixed = run_pytest(
        CUDA_TESTS, "cuda", here / "cuda-tests.xml", [*extra, "-k", f"not {TUNED_K}"], deadline - time.time(),
        env={"SUITE_TRITON_TUNE": "0"},
    )  # fmt: skip
    if fixed["exit"] == "timeout":
        return fixed
    if deadline - time.time() < MIN_S + INTERRUPT_GRACE_S:  # not started to be cut: left for the next call
        return merged(fixed, {"command": "(tuned: not started)", "exit": "timeout", "seconds": 0.0, "tail": ""})
    tuned_report = here / "cuda-tests-tuned.xml"
    tuned = run_pytest(TUNED_TESTS, "cuda", tuned_report, [*extra, "-k", TUNED_K], deadline - time.time())
    return merged(fixed, tuned)


def merged(*runs: dict) -> dict:
    """Several pytest runs as one part of a stage report."""
    out = {
        "command": " ; ".join(r["command"] for r in runs),
        # a cut run first (what it did not reach is left for the next call), else the first that failed
        "exit": "timeout"
        if any(r["exit"] == "timeout" for r in runs)
        else next((r["exit"] for r in runs if r["exit"]), 0),
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        "tail": "\n".join(r["tail"] for r in runs)[-6000:],
    }
    for key in ("passed", "failed", "skipped", "errors", "collected"):
        got = [r[key] for r in runs if r.get(key) is not None]  # a run without a report counts nothing
        out[key] = sum(got) if got else None
    return out


def counted_line(run: dict) -> str:
    """`N passed, N failed, N errors, N skipped`, or that the run wrote no JUnit report (nothing to count)."""
    if run.get("passed") is None:
        return "no JUnit report written (nothing counted)"
    return f"{run['passed']} passed, {run['failed']} failed, {run['errors']} errors, {run['skipped']} skipped"
