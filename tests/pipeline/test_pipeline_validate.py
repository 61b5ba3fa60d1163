"""The validator rejects hand-corrupted schedules with a message naming stage, action and rule."""

import dataclasses
import re

import pytest

from methods.pipeline.schedules.schedule import Action, Kind, Schedule, gpipe, one_f_one_b, two_bw
from methods.pipeline.schedules.validate import ScheduleError, execution_order, validate


def _edit(sch, stage, fn):
    acts = [list(a) for a in sch.actions]
    acts[stage] = fn(acts[stage])
    return Schedule(sch.name, sch.d, sch.m, sch.steps, acts)


def _index(acts, token):
    return [a.token for a in acts].index(token)


def _raises(sch, *patterns):
    with pytest.raises(ScheduleError) as err:
        validate(sch)
    for p in patterns:
        assert re.search(p, str(err.value)), str(err.value)
    return str(err.value)


def test_report_of_a_valid_schedule():
    rep = validate(one_f_one_b(3, 5))
    assert rep.peak_stash == [3, 2, 1] and rep.stash_bound == [3, 2, 1]
    assert rep.counts[0]["FORWARD"] == 5 and rep.counts[1]["SEND_GRAD"] == 5
    assert len(rep.order) == sum(len(a) for a in one_f_one_b(3, 5).actions)


def test_swapped_forward_and_backward():
    def swap(acts):
        i, j = _index(acts, "F0"), _index(acts, "B0")
        acts[i], acts[j] = acts[j], acts[i]
        return acts

    _raises(_edit(one_f_one_b(2, 2), 1, swap), r"stage 1, action 1 \(B0\)", "precedes its forward")


def test_dropped_receive():
    sch = _edit(one_f_one_b(2, 3), 1, lambda acts: [a for a in acts if a.token != "<a1"])
    _raises(sch, r"stage 0, action \d+ \(>a1\)", "no matching recv of micro-batch 1 on stage 1")


def test_dropped_send_and_receive_pair_breaks_dataflow():
    sch = _edit(gpipe(2, 2), 0, lambda acts: [a for a in acts if a.token != "<g1"])
    sch = _edit(sch, 1, lambda acts: [a for a in acts if a.token != ">g1"])
    _raises(sch, "stage 0", "RECV_GRAD of micro-batch 1", "gradient received before backward")


def test_cyclic_wait_deadlock():
    # Stage 0 waits for gradient 0 before sending activation 0, which stage 1 needs first.
    def early_recv(acts):
        i, j = _index(acts, ">a0"), _index(acts, "<g0")
        acts.insert(i, acts.pop(j))
        return acts

    sch = _edit(one_f_one_b(2, 1), 0, early_recv)
    msg = _raises(
        sch,
        "deadlock",
        r"stage 0, action 1 \(<g0\) waits for SEND_GRAD",
        r"stage 1, action 0 \(<a0\) waits for SEND_ACT",
    )
    with pytest.raises(ScheduleError, match="deadlock"):
        execution_order(sch)
    assert "cyclic wait" in msg


def test_deadlock_across_three_stages():
    # Stage 0 waits for gradient 0 before sending activation 1: stage 1 then blocks on
    # activation 1, stage 2 on stage 1's activation 1, and nobody ever sends gradient 0.
    def wait_first(acts):
        acts.insert(_index(acts, ">a1"), acts.pop(_index(acts, "<g0")))
        return acts

    _raises(
        _edit(gpipe(3, 2), 0, wait_first),
        "deadlock",
        r"stage 0, action \d+ \(<g0\)",
        r"stage 1, action \d+ \(<a1\)",
        r"stage 2, action \d+ \(<a1\)",
    )


def test_stash_bound_exceeded():
    g = gpipe(2, 4)  # all forwards first: 4 in flight on stage 0, but 1F1B allows d - s = 2
    _raises(
        Schedule("1f1b", 2, 4, 1, g.actions),
        r"stage 0, action \d+ \(F2\)",
        "3 micro-batches in flight",
        "stash bound 2",
    )


def test_duplicate_and_missing_actions():
    dup = _edit(gpipe(1, 2), 0, lambda acts: acts[:1] + acts)
    _raises(dup, r"stage 0, action 1 \(F0\)", "duplicate FORWARD")
    gone = _edit(gpipe(1, 2), 0, lambda acts: [a for a in acts if a.token != "B1"])
    _raises(gone, "stage 0", "missing BACKWARD", r"\[1\]")
    extra_step = _edit(gpipe(1, 2), 0, lambda acts: acts + acts[-1:])
    _raises(extra_step, "2 OPTIMIZER_STEP")


def test_wrong_peer_and_stage():
    bad = _edit(
        gpipe(2, 1), 0, lambda acts: [dataclasses.replace(a, peer=0) if a.kind is Kind.SEND_ACT else a for a in acts]
    )
    _raises(bad, r"stage 0, action 1 \(>a0\)", "must have peer 1")
    moved = _edit(gpipe(2, 1), 0, lambda acts: [dataclasses.replace(acts[0], stage=1)] + acts[1:])
    _raises(moved, "stage 0, action 0", "says stage 1")


def test_two_bw_wrong_version():
    def stale(acts):
        i = _index(acts, "F4@v1")
        acts[i] = dataclasses.replace(acts[i], version=0)
        return acts

    _raises(_edit(two_bw(2, 2, 3), 0, stale), r"stage 0, action \d+ \(F4\)", "version rule gives 1")


def test_backward_version_differs_from_forward():
    def other(acts):
        i = _index(acts, "B4@v1")
        acts[i] = dataclasses.replace(acts[i], version=2)
        return acts

    _raises(_edit(two_bw(2, 2, 3), 1, other), r"\(B4@v2\)", "forward used 1", "same version")


def test_two_bw_three_live_versions():
    # Stepping the optimizer again before group 1 (still on version 0) has drained needs 3 copies.
    def early_update(acts):
        i = _index(acts, "U@v2")
        r, u = acts[i - 1], acts[i]
        del acts[i - 1 : i + 1]
        j = _index(acts, "U@v1") + 1
        acts[j:j] = [r, u]
        return acts

    _raises(
        _edit(two_bw(2, 2, 3), 1, early_update),
        r"stage 1, action \d+ \(U@v2\)",
        r"3 live weight versions \[0, 1, 2\]",
        "bound 2",
    )


def test_version_used_before_it_exists():
    # Moving a step-1 forward before the flush uses version 1 before the update creates it.
    def early(acts):
        f = acts.pop(_index(acts, "F2@v1"))
        acts.insert(_index(acts, "U@v1") - 1, f)
        return acts

    _raises(_edit(gpipe(1, 2, 2), 0, early), r"\(F2@v1\)", "before it is produced")


def test_flush_keeps_a_single_version():
    def late(acts):  # backward of step 0 after step 0's update
        b = acts.pop(_index(acts, "B1"))
        acts.insert(_index(acts, "U@v1") + 1, b)
        return acts

    _raises(_edit(one_f_one_b(1, 2, 2), 0, late), r"2 live weight versions \[0, 1\]", "bound 1")


def test_unknown_microbatch_and_per_step_mb():
    bad = _edit(gpipe(1, 1), 0, lambda acts: acts + [Action(Kind.FORWARD, 0, 7)])
    _raises(bad, "micro-batch 7 outside 0..0")
    bad = _edit(gpipe(1, 1), 0, lambda acts: [Action(Kind.ALL_REDUCE, 0, 0)] + acts)
    _raises(bad, "must not carry a micro-batch")
