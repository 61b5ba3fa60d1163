"""Simulator: GPipe bubble formula, 1F1B vs GPipe, measured records, Chrome trace and PNG output."""

import json

import pytest

from methods.pipeline.schedules.schedule import Kind, gpipe, one_f_one_b, two_bw
from methods.pipeline.schedules.simulate import Costs, Timeline, draw, simulate, to_chrome_trace
from methods.pipeline.schedules.validate import ScheduleError


@pytest.mark.parametrize("steps", [1, 2])
def test_gpipe_bubble_formula_exact(steps):
    for d in range(1, 9):
        for m in range(1, 33):
            tl = simulate(gpipe(d, m, steps))
            assert tl.makespan == 2 * (m + d - 1) * steps
            assert tl.bubble == (d - 1) / (m + d - 1)  # exact: integer costs, one rounding


def test_gpipe_bubble_with_backward_twice_forward():
    for d, m in [(2, 4), (4, 4), (4, 8), (8, 3)]:
        tl = simulate(gpipe(d, m), Costs(forward=1, backward=2))
        assert tl.makespan == 3 * (m + d - 1)
        assert tl.bubble == (d - 1) / (m + d - 1)


def test_one_f_one_b_same_makespan_as_gpipe_but_smaller_stash():
    for d in range(1, 9):
        for m in range(1, 33):
            g, f = simulate(gpipe(d, m)), simulate(one_f_one_b(d, m))
            assert f.makespan == g.makespan and f.bubble == g.bubble
            assert f.peak_stash == [min(d - s, m) for s in range(d)]
            assert g.peak_stash == [m] * d
            assert all(a <= b for a, b in zip(f.peak_stash, g.peak_stash))
            if m > 1:  # the last stage holds one micro-batch instead of m
                assert f.peak_stash[-1] == 1 < g.peak_stash[-1]


def test_two_bw_drops_flush_bubbles():
    for d, m, steps in [(2, 2, 4), (4, 4, 3), (4, 8, 2), (8, 8, 4)]:
        flush, tbw = simulate(one_f_one_b(d, m, steps)), simulate(two_bw(d, m, steps))
        # Warm-up and drain are paid once instead of once per step.
        assert tbw.makespan == 2 * (m * steps + d - 1)
        assert flush.makespan == 2 * (m + d - 1) * steps
        assert tbw.throughput > flush.throughput
        assert tbw.peak_stash == flush.peak_stash


def test_throughput_and_per_stage_costs():
    tl = simulate(gpipe(2, 4), microbatch_size=8)
    assert tl.throughput == 4 * 8 / tl.makespan
    # Slow last stage: the pipeline runs at its pace, others idle.
    slow = [Costs(1, 1), Costs(3, 3)]
    tl = simulate(one_f_one_b(2, 4), slow)
    assert tl.makespan == 1 + 4 * 6 + 1
    assert tl.busy == [8, 24]
    with pytest.raises(ValueError):
        simulate(gpipe(2, 2), [Costs()])


def test_receive_waits_for_send_and_comm_cost():
    tl = simulate(gpipe(2, 1), Costs(forward=1, backward=1, send=0.5, optimizer=0.25))
    s1 = {e.action.token: e for e in tl.events[1]}
    s0 = {e.action.token: e for e in tl.events[0]}
    assert s1["<a0"].end == s0[">a0"].end == 1.5  # activation arrives when the send ends
    assert s1["F0"].start == 1.5
    assert s1["B0"].end == 3.5 and s0["<g0"].end == s1[">g0"].end == 4.0
    assert tl.makespan == 5.0 + 0.25  # B0 on stage 0 ends at 5, then the optimizer step


def test_simulating_a_deadlocked_schedule_raises():
    sch = one_f_one_b(2, 1)
    a = sch.actions[0]
    a[1], a[2] = a[2], a[1]  # <g0 before >a0
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(sch)


def _records(tl):
    return [
        {
            "stage": s,
            "kind": e.action.kind.value,
            "mb": e.action.mb,
            "version": e.action.version,
            "start": 100.0 + e.start,
            "end": 100.0 + e.end,
        }
        for s, evs in enumerate(tl.events)
        for e in evs
    ]


def test_timeline_from_measured_records():
    tl = simulate(two_bw(3, 3, 2), microbatch_size=4)
    back = Timeline.from_records(reversed(_records(tl)), microbatch_size=4)
    assert back.d == 3 and back.makespan == tl.makespan and back.bubble == tl.bubble
    assert back.peak_stash == tl.peak_stash and back.throughput == tl.throughput
    assert [e.start for e in back.events[2]] == [e.start for e in tl.events[2]]
    short = Timeline.from_records(
        [
            {"stage": 0, "kind": "F", "mb": 0, "start": 2.0, "end": 3.0},
            {"stage": 0, "kind": "B", "mb": 0, "start": 3.0, "end": 5.0},
        ]
    )
    assert short.makespan == 3.0 and short.bubble == 0.0
    assert short.events[0][1].action.kind is Kind.BACKWARD


def test_chrome_trace(tmp_path):
    tl = simulate(one_f_one_b(3, 4))
    path = tmp_path / "trace.json"
    n = to_chrome_trace(tl, path)
    data = json.loads(path.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert n == len(xs) == sum(len(evs) for evs in tl.events)
    assert {e["tid"] for e in xs} == {0, 1, 2} and {e["pid"] for e in xs} == {0}
    assert sum(e["cat"] == "FORWARD" for e in xs) == 3 * 4
    f = next(e for e in xs if e["tid"] == 2 and e["name"] == "F0")
    assert (f["ts"], f["dur"]) == (2e6, 1e6)


@pytest.mark.parametrize("gen,args", [(gpipe, (4, 4)), (two_bw, (4, 4, 3))])
def test_draw_writes_png(tmp_path, gen, args):
    path = tmp_path / "timeline.png"
    draw(simulate(gen(*args), Costs(1, 2, optimizer=0.5)), path, title=gen.__name__)
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
