"""Distributed executor on gloo ranks: equivalence with grad_accum, stash bounds, and failures that end the run."""

import re
import subprocess
import time

import pytest

from methods.pipeline.executors.torchrun import torchrun

TIMEOUT = 180  # a hang fails the test instead of stalling the run
TINY = [
    "--set",
    "model.layers=2",
    "--set",
    "model.hidden=32",
    "--set",
    "model.heads=2",
    "--set",
    "model.intermediate=64",
    "--set",
    "seq_len=8",
    "--steps",
    "3",
]


def _check(method, stages, width, recompute, extra=(), m=4):
    args = [
        "--method",
        method,
        *TINY,
        "--set",
        f"num_micro_batches={m}",
        "--set",
        f"stages={stages}",
        "--set",
        f"width={width}",
        "--set",
        f"recompute={'on' if recompute else 'off'}",
        *extra,
    ]
    try:
        return torchrun(stages * width, "methods.pipeline.executors.dist_check", args, TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{method} d={stages} w={width} did not finish within {TIMEOUT} s (hang)")


def _assert_passes(proc, stages):
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "PASS: largest" in out, out
    largest = float(re.search(r"PASS: largest (\S+)", out).group(1))
    assert largest <= 1e-5
    peaks = re.search(r"peak stash per stage: measured (\[.*?\]), validator (\[.*?\]) \(bound (\[.*?\])\): equal", out)
    assert peaks, out
    assert peaks.group(1) == peaks.group(2) == peaks.group(3)  # m >= d: the validator's bound is reached
    assert len(eval(peaks.group(1))) == stages
    assert "bitwise identical weights" in out
    return largest


# A representative subset in the default run; all combinations below under `slow`.
@pytest.mark.parametrize(
    "method,stages,width,recompute",
    [
        ("gpipe", 2, 1, True),
        pytest.param("pipedream-flush", 4, 1, False, marks=pytest.mark.slow),  # four stages: make test-slow
        pytest.param("pipedream-flush", 2, 2, False, marks=pytest.mark.slow),  # make test stays inside 15 minutes
    ],
)
def test_dist_matches_grad_accum(method, stages, width, recompute):
    largest = _assert_passes(_check(method, stages, width, recompute, m=4 * width), stages)
    if width == 1:
        assert largest == 0.0  # same micro-batches, same accumulation order: the same bits


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("stages,width", [(2, 1), (4, 1), (2, 2), (1, 2)])
@pytest.mark.parametrize("method", ["gpipe", "pipedream-flush"])
def test_dist_matches_grad_accum_all_combinations(method, stages, width, recompute):
    _assert_passes(_check(method, stages, width, recompute, m=4 * width), stages)


@pytest.mark.slow
def test_dist_clip_grad_norm_matches_grad_accum():
    _assert_passes(_check("pipedream-flush", 2, 2, False, ["--set", "clip_grad_norm=0.05"], m=8), 2)


@pytest.mark.slow  # make test-slow: it waits out a timeout (15 s)
def test_a_hung_rank_ends_the_run_with_a_timeout_error():
    started = time.monotonic()
    proc = _check("pipedream-flush", 2, 1, False, ["--set", "timeout=10", "--fault", "hang"])
    assert proc.returncode != 0
    assert time.monotonic() - started < 90
    err = proc.stderr
    assert "[pipeline rank 0, stage 0, replica 0] step failed at <g" in err, err[-3000:]
    assert "Traceback" in err and "Timed out" in err


def test_a_dead_rank_ends_the_run_with_an_error():
    started = time.monotonic()
    proc = _check("gpipe", 2, 1, True, ["--fault", "exit"])
    assert proc.returncode != 0
    assert time.monotonic() - started < 90
    # torchrun names the dead rank; its peer either reports the closed connection or is torn down first.
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: 3", proc.stderr), proc.stderr[-3000:]


@pytest.mark.slow
def test_a_raising_rank_reports_its_traceback():
    proc = _check("pipedream-flush", 2, 1, False, ["--fault", "raise", "--fault-rank", "0"])
    assert proc.returncode != 0
    assert "[rank 0] failed" in proc.stderr and "RuntimeError: injected fault" in proc.stderr
    assert "Traceback" in proc.stderr
