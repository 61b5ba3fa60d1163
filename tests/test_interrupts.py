"""Interrupts lose nothing: Ctrl-C or SIGTERM ends a run in one line, keeps its finished rounds, discards the
running one, and the same command resumes the same sweep."""

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ["--only", "baseline-fp32", "--only", "l2l-fp32"]


def _run(tmp_path, extra, stop_at=None, sig=None):
    """The CLI on table2's two rows in two rounds; with `stop_at`, `sig` is sent when a progress line has it."""
    env = {**os.environ, "SUITE_RESULTS_DIR": str(tmp_path), "SUITE_MACHINE": "m", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "suite", "run", "table2", "--profile", "tiny", *ROWS, "--rounds", "2"]
    proc = subprocess.Popen(
        cmd + ["--wandb", "off", *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if stop_at and stop_at in line:
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + out, err


def _records(tmp_path):
    recs = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "m").glob("*.json")]
    return {r["row"]: r for r in recs}


@pytest.mark.parametrize(
    "sig, extra",
    [
        # Ctrl-C: make test-slow (about 20 s each); the default run sends SIGTERM, which the campaign's kill sends
        pytest.param(signal.SIGINT, ["--worker"], marks=pytest.mark.slow),
        pytest.param(signal.SIGINT, [], marks=pytest.mark.slow),  # a fresh process per cell
        (signal.SIGTERM, ["--worker"]),
    ],
    ids=["int-worker", "int-fresh-processes", "term-worker"],
)
def test_an_interrupt_keeps_the_finished_rounds_and_the_same_command_resumes_the_sweep(tmp_path, sig, extra):
    code, out, err = _run(tmp_path, extra, stop_at="l2l-fp32 (l2l, tiny) round 2/2: running", sig=sig)
    assert code == 130, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: table2/l2l-fp32") and "Traceback" not in err, err
    before = _records(tmp_path)
    assert before["baseline-fp32"]["status"] == "ok" and before["l2l-fp32"]["status"] == "partial: 1/2 rounds"
    kept = before["l2l-fp32"]["metrics"]["throughput"]
    sweep = before["baseline-fp32"]["sweep"]
    assert before["l2l-fp32"]["sweep"] == sweep and f"sweep {sweep}" in lines[0]
    code, out, err = _run(tmp_path, extra)
    assert code == 0, (out, err)
    after = _records(tmp_path)
    assert after["l2l-fp32"]["status"] == "ok" and after["l2l-fp32"]["sweep"] == sweep  # the same sweep
    assert after["l2l-fp32"]["metrics"]["throughput_rounds"][0] == kept  # its finished round, kept
    assert after["baseline-fp32"]["finished"] == before["baseline-fp32"]["finished"]  # reused, not re-run
    assert "l2l-fp32 xbaseline-fp32" not in out  # (the table is on disk)
    table = (tmp_path / "table2.md").read_text()
    assert "came from other sweeps" not in table


def test_a_signal_that_arrives_inside_a_poll_is_raised_after_it_and_the_killed_child_is_still_reaped():
    """CI saw a SIGTERM'd runner print its line and never exit: the signal had landed inside Popen.poll, between
    its wait lock taken and freed, and the wait that reaps the killed cell blocked on that lock for ever."""
    from suite.core import interrupts

    previous = interrupts.install()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    real, order = proc.poll, []

    def poll():  # the signal arrives while the poll runs (before it has taken its lock)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # the bytecodes where an unshielded handler would raise
            pass
        order.append("poll returned")
        return real()

    proc.poll = poll
    try:
        with pytest.raises(KeyboardInterrupt):
            interrupts.wait_for(proc, 30)
        order.append("interrupted")
        proc.poll = real
        interrupts.kill_session(proc)  # reaps it
        assert proc.returncode == -signal.SIGKILL and order == ["poll returned", "interrupted"]
    finally:
        interrupts.restore(previous)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_outside_a_shield_both_signals_interrupt_at_once():
    from suite.core import interrupts

    previous = interrupts.install()
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), sig)
                for _ in range(10_000_000):
                    pass
                raise AssertionError(f"{sig!r} did not interrupt")
    finally:
        interrupts.restore(previous)
