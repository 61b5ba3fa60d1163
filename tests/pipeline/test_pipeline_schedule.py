"""Golden text tables and exhaustive properties of the GPipe, 1F1B and 2BW schedule generators."""

from collections import Counter

import pytest

from methods.pipeline.schedules.schedule import (
    BACKWARD,
    FORWARD,
    Action,
    Kind,
    gpipe,
    one_f_one_b,
    two_bw,
    weight_version,
)
from methods.pipeline.schedules.validate import validate

# Derived by hand from the paper's Figure 3 (2 stages, GPipe and PipeDream-Flush) and Figure 2
# (2BW: stage s warms up with d-s-1 forwards, then alternates 1F1B with no flush; micro-batch
# ids here are 0-indexed, the paper's are 1-indexed). Sends follow F/B, receives precede them.
GOLDEN = {
    ("gpipe", 2, 2, 1): """\
s0: F0 >a0 F1 >a1 <g0 B0 <g1 B1 R U@v1
s1: <a0 F0 <a1 F1 B0 >g0 B1 >g1 R U@v1""",
    ("1f1b", 2, 4, 1): """\
s0: F0 >a0 F1 >a1 <g0 B0 F2 >a2 <g1 B1 F3 >a3 <g2 B2 <g3 B3 R U@v1
s1: <a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 <a3 F3 B3 >g3 R U@v1""",
    ("1f1b", 3, 3, 1): """\
s0: F0 >a0 F1 >a1 F2 >a2 <g0 B0 <g1 B1 <g2 B2 R U@v1
s1: <a0 F0 >a0 <a1 F1 >a1 <g0 B0 >g0 <a2 F2 >a2 <g1 B1 >g1 <g2 B2 >g2 R U@v1
s2: <a0 F0 B0 >g0 <a1 F1 B1 >g1 <a2 F2 B2 >g2 R U@v1""",
    ("2bw", 2, 2, 2): """\
s0: F0 >a0 F1 >a1 <g0 B0 F2 >a2 <g1 B1 R U@v1 F3 >a3 <g2 B2 <g3 B3 R U@v2
s1: <a0 F0 B0 >g0 <a1 F1 B1 >g1 R U@v1 <a2 F2 B2 >g2 <a3 F3 B3 >g3 R U@v2""",
    # Third group (mb 4, 5; k = 5, 6) is the first to use version 1, made after mb 1's backward.
    ("2bw", 2, 2, 3): """\
s0: F0 >a0 F1 >a1 <g0 B0 F2 >a2 <g1 B1 R U@v1 F3 >a3 <g2 B2 F4@v1 >a4 <g3 B3 R U@v2 \
F5@v1 >a5 <g4 B4@v1 <g5 B5@v1 R U@v3
s1: <a0 F0 B0 >g0 <a1 F1 B1 >g1 R U@v1 <a2 F2 B2 >g2 <a3 F3 B3 >g3 R U@v2 \
<a4 F4@v1 B4@v1 >g4 <a5 F5@v1 B5@v1 >g5 R U@v3""",
}
GEN = {"gpipe": gpipe, "1f1b": one_f_one_b, "2bw": two_bw}


@pytest.mark.parametrize("key", GOLDEN, ids=lambda k: "%s-d%d-m%d-steps%d" % k)
def test_golden_tables(key):
    name, d, m, steps = key
    sch = GEN[name](d, m, steps)
    assert sch.to_text() == GOLDEN[key]
    validate(sch)


def test_compute_only_text_matches_figure3_flush():
    # Paper Figure 3b, worker 1: 1 2 1 3 2 4 3 4; worker 2: 1 1 2 2 3 3 4 4 (1-indexed).
    assert one_f_one_b(2, 4).to_text(comm=False) == (
        "s0: F0 F1 B0 F2 B1 F3 B2 B3 R U@v1\ns1: F0 B0 F1 B1 F2 B2 F3 B3 R U@v1"
    )


def test_action_accepts_plain_strings_and_is_frozen():
    a = Action("FORWARD", 0, 3, 1)
    assert a.kind is Kind.FORWARD and a.token == "F3@v1" and str(a) == "F3@v1"
    with pytest.raises(Exception):
        a.mb = 4


def test_version_rule_matches_paper():
    # Paper §3.1 with m = 4 (Figure 2): inputs k = 1..8 use version 0, k = 9..12 version 1.
    assert [weight_version("2bw", k - 1, 4) for k in range(1, 14)] == [0] * 8 + [1] * 4 + [2]
    assert [weight_version("1f1b", mb, 4) for mb in (0, 3, 4, 8)] == [0, 0, 1, 2]


@pytest.mark.parametrize("bad", [(0, 2, 1), (2, 0, 1), (2, 2, 0), (2.0, 2, 1)])
def test_generators_reject_bad_sizes(bad):
    for gen in GEN.values():
        with pytest.raises(ValueError):
            gen(*bad)


def _check_properties(sch, peak_expected, live_expected):
    d, n = sch.d, sch.n_microbatches
    rep = validate(sch)  # counts, order, pairing, deadlock, stash and version bounds
    assert rep.peak_stash == peak_expected
    assert rep.peak_live_versions == [live_expected] * d
    for s, acts in enumerate(sch.actions):
        c = Counter(a.kind for a in acts)
        assert c[FORWARD] == c[BACKWARD] == n
        assert c[Kind.OPTIMIZER_STEP] == c[Kind.ALL_REDUCE] == sch.steps
        assert c[Kind.SEND_ACT] == (n if s < d - 1 else 0)
        assert c[Kind.RECV_GRAD] == (n if s < d - 1 else 0)
        assert c[Kind.RECV_ACT] == c[Kind.SEND_GRAD] == (n if s > 0 else 0)
        # Every stage runs forwards and backwards each in ascending micro-batch order.
        assert [a.mb for a in acts if a.kind is FORWARD] == list(range(n))
        assert [a.mb for a in acts if a.kind is BACKWARD] == list(range(n))
        for a in acts:
            if a.kind in (FORWARD, BACKWARD):
                assert a.version == weight_version(sch.name, a.mb, sch.m)


@pytest.mark.parametrize("d", range(1, 9))
def test_properties_all_small_sizes(d):
    for m in range(1, 33):
        for steps in (1, 2):
            _check_properties(gpipe(d, m, steps), [m] * d, 1)
            _check_properties(one_f_one_b(d, m, steps), [min(d - s, m) for s in range(d)], 1)
            _check_properties(two_bw(d, m, steps), [min(d - s, m + 1, steps * m) for s in range(d)], min(steps, 2))


def test_two_bw_updates_follow_each_group_and_two_versions_suffice():
    sch = two_bw(4, 4, steps=3)
    for s, acts in enumerate(sch.actions):
        steps_at = [i for i, a in enumerate(acts) if a.kind is Kind.OPTIMIZER_STEP]
        assert [acts[i].version for i in steps_at] == [1, 2, 3]
        for g, i in enumerate(steps_at):
            last_b = max(j for j, a in enumerate(acts) if a.kind is BACKWARD and a.mb // 4 == g)
            assert last_b < i  # the update waits for the group's last backward on this stage
            # ... and precedes the first forward that needs the version it creates (group g+2).
            firsts = [j for j, a in enumerate(acts) if a.kind is FORWARD and a.mb // 4 == g + 2]
            assert not firsts or i < firsts[0]
    assert validate(sch).peak_live_versions == [2, 2, 2, 2]


def test_flush_schedules_are_not_rendezvous_safe_except_gpipe():
    # Executors must use non-blocking sends (isend / batched p2p): blocking send pairs deadlock
    # in 1F1B steady state, where neighbours send to each other at the same time.
    assert validate(gpipe(4, 8)).rendezvous_safe
    assert not validate(one_f_one_b(4, 8)).rendezvous_safe
    assert not validate(two_bw(4, 8, 2)).rendezvous_safe
    assert validate(one_f_one_b(1, 3)).rendezvous_safe
