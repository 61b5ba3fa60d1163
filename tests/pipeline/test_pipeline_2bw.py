"""PipeDream-2BW: per-step windows of the schedule, double-buffered stages, equivalence with 2bw-reference."""

import dataclasses

import pytest
import torch

# Sibling test modules (pytest's rootdir import mode puts tests/pipeline on sys.path).
from test_pipeline_exec_dist import _assert_passes, _check
from test_pipeline_schedule import GOLDEN

from methods.pipeline.schedules.schedule import (
    FORWARD,
    OPTIMIZER_STEP,
    Schedule,
    _shift_groups,
    two_bw,
    two_bw_drain,
    two_bw_window,
)
from methods.pipeline.schedules.validate import ScheduleError, validate
from suite.commands import cli
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.harness.data import synthetic_batches

MODEL = ModelConfig(layers=2, hidden=32, heads=2, intermediate=64)  # 4 layers: embeddings, 2 blocks, head


def _run(m=4, **opts):
    return RunConfig(
        method="pipedream-2bw",
        model=MODEL,
        seq_len=8,
        micro_batch_size=4,
        num_micro_batches=m,
        device="cpu",
        options={"executor": "reference", **opts},
    )


def _windows(d, m, steps, start=0):
    """Per stage: the windows of steps start..start+steps-1 and the drain, concatenated."""
    parts = [two_bw_window(d, m, start + t, start) for t in range(steps)] + [two_bw_drain(d, m, start + steps, start)]
    return [[a for part in parts for a in part[s]] for s in range(d)]


def test_registered_with_pipeline_options():
    from methods.pipeline.method import PipelineMethod
    from suite.core import registry

    cls = registry.get("pipedream-2bw")
    assert issubclass(cls, PipelineMethod) and cls.schedule_name == "2bw" and cls.stage_versions == 2
    assert cls.options["recompute"].default is False and cls.precisions == ("fp32",)
    assert registry.get("2bw-reference").options.keys() == registry.get("grad_accum").options.keys()


@pytest.mark.parametrize("d", range(1, 6))
def test_windows_and_drain_are_exactly_the_schedule(d):
    for m in range(1, 6):
        for steps in range(1, 5):
            full = two_bw(d, m, steps)
            assert _windows(d, m, steps) == full.actions
            # A stream restarted after a drain at minibatch 3: the same schedule, 3 minibatches later.
            assert _windows(d, m, steps, start=3) == [[_shift_groups(a, 3, m) for a in acts] for acts in full.actions]


@pytest.mark.parametrize("key", [k for k in GOLDEN if k[0] == "2bw"], ids=lambda k: "d%d-m%d-steps%d" % k[1:])
def test_windows_reproduce_the_golden_tables(key):
    _, d, m, steps = key
    sch = Schedule("2bw", d, m, steps, _windows(d, m, steps))
    assert sch.to_text() == GOLDEN[key]


def test_every_window_holds_one_update_per_stage_after_the_first():
    # Update t runs during step t+1 on every stage, so a global clip norm pairs across stages.
    for d, m in ((1, 2), (2, 4), (4, 4), (4, 2)):
        assert all(not [a for a in acts if a.kind is OPTIMIZER_STEP] for acts in two_bw_window(d, m, 0))
        for t in (1, 2, 5):
            assert [[a.version for a in acts if a.kind is OPTIMIZER_STEP] for acts in two_bw_window(d, m, t)] == [
                [t]
            ] * d


@pytest.mark.parametrize("d,m", [(2, 4), (4, 4), (4, 2), (3, 1)])
def test_validator_proves_version_rule_and_two_live_versions(d, m):
    method_steps = 3  # what PipeDream2BW validates at start-up: every later window is a shift
    rep = validate(two_bw(d, m, method_steps))
    assert rep.peak_live_versions == [2] * d
    assert validate(two_bw(d, m, 6)).peak_live_versions == [2] * d
    # The validator can fail: a forward on the version one step too new breaks the version rule.
    sch = two_bw(d, m, method_steps)
    i = next(i for i, a in enumerate(sch.actions[0]) if a.kind is FORWARD and a.mb == 2 * m)
    sch.actions[0][i] = dataclasses.replace(sch.actions[0][i], version=sch.actions[0][i].version + 1)
    with pytest.raises(ScheduleError):
        validate(sch)


@pytest.mark.parametrize("stages,recompute", [(2, False), (3, True)])
def test_reference_executor_matches_2bw_reference(stages, recompute):
    result = check(_run(stages=stages, recompute=recompute), "2bw-reference", steps=4)
    assert result.passed, result.report(top=5)
    # One process, one accumulation order: the same bits, losses included.
    assert result.worst[1] == 0.0, result.report(top=5)
    assert all(a == b for a, b in result.losses)


def test_delayed_update_differs_from_grad_accum_after_the_first_step():
    """Negative control: step 0 uses W(0) in both, so one step agrees bit for bit; from step 1 on
    2BW's gradients are taken one version back, and four steps are far outside the tolerance."""
    one = check(_run(stages=2), "grad_accum", steps=1)
    assert one.passed and one.worst[1] == 0.0
    four = check(_run(stages=2), "grad_accum", steps=4)
    assert not four.passed and four.worst[1] > 100 * four.tolerance, four.report(top=3)
    ref = check(dataclasses.replace(_run(), method="2bw-reference", options={}), "grad_accum", steps=2)
    assert not ref.passed


def test_state_dict_drains_and_the_next_step_restarts_the_stream():
    run = _run(stages=3).validate()
    subject = build_method(run)
    ref = build_method(dataclasses.replace(run, method="2bw-reference", options={}))
    a, b = synthetic_batches(run), synthetic_batches(run)
    w0 = ref.state_dict()
    for n in (2, 3):
        for _ in range(n):
            assert subject.step(next(a)).loss == ref.step(next(b)).loss
        mine, theirs = subject.state_dict(), ref.state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
        assert all(not st.stash for st in subject.stages)  # drained: nothing in flight
        assert all(st.version == subject.step_count for st in subject.stages)
    assert any(not torch.equal(w0[k], theirs[k]) for k in theirs)


def test_stages_hold_two_versions_and_the_shadow_is_a_separate_copy():
    run = _run(stages=2).validate()
    subject = build_method(run)
    batches = synthetic_batches(run)
    for _ in range(3):
        subject.step(next(batches))
    for st in subject.stages:
        # Update 2 has run (during step 2); version 2 is the latest and version 1 the shadow.
        assert sorted(st.weights) == [1, 2] and st.version == 2
        p, latest, shadow = st.params[0], st.weights[2][0], st.weights[1][0]
        assert latest.data_ptr() == p.data_ptr() != shadow.data_ptr()
        assert not torch.equal(latest, shadow)
    # The shadow is counted as resident: one extra copy of the weights, no extra optimizer state.
    flush = build_method(dataclasses.replace(run, method="pipedream-flush"))
    flush.step(next(synthetic_batches(run)))
    assert subject.resident_device_bytes() - flush.resident_device_bytes() == sum(
        p.numel() * p.element_size() for st in subject.stages for p in st.params
    )
    with pytest.raises(RuntimeError, match=r"holds versions \[1, 2\]"):
        subject.stages[0].check_version(dataclasses.replace(two_bw(2, 4, 1).actions[0][0], version=0))
    with pytest.raises(RuntimeError, match="no update-free step"):
        subject.gradients(next(batches))


def test_two_weight_buffers_are_allocated_once_and_alternate():
    """After the first update a stage steps each new version in the dead version's buffer: the same two
    storages per parameter for the whole run (no allocation per update, as a double buffer should be)."""
    run = _run(stages=2).validate()
    subject = build_method(run)
    batches = synthetic_batches(run)
    seen = []
    for _ in range(5):
        subject.step(next(batches))
        seen.append({v: ts[0].data_ptr() for v, ts in subject.stages[0].weights.items()})
    buffers = {ptr for versions in seen[1:] for ptr in versions.values()}
    assert len(buffers) == 2, seen
    assert all(len(v) == 2 for v in seen[1:])


def test_clip_grad_norm_is_applied_under_weight_stashing():
    clipped = dataclasses.replace(_run(stages=2), clip_grad_norm=0.05)
    result = check(clipped, "2bw-reference", steps=3)
    assert result.passed, result.report(top=5)  # not bitwise: clip_grad_norm_ sums the norm in another order
    # The clip is active: without it the same three steps end elsewhere.
    ends = []
    for run in (clipped.validate(), _run(stages=2).validate()):
        method, batches = build_method(run), synthetic_batches(run)
        for _ in range(3):
            method.step(next(batches))
        ends.append(method.state_dict())
    assert any(not torch.allclose(ends[0][k], ends[1][k]) for k in ends[1])


def test_dist_two_ranks_matches_2bw_reference():
    largest = _assert_passes(_check("pipedream-2bw", 2, 1, False, ["--against", "2bw-reference", "--steps", "4"]), 2)
    assert largest == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "stages,width,recompute,extra",
    [(4, 1, False, []), (2, 2, False, []), (2, 2, True, ["--set", "clip_grad_norm=0.05"]), (1, 2, False, [])],
)
def test_dist_matches_2bw_reference_all_combinations(stages, width, recompute, extra):
    _assert_passes(
        _check(
            "pipedream-2bw",
            stages,
            width,
            recompute,
            ["--against", "2bw-reference", "--steps", "4", *extra],
            m=4 * width,
        ),
        stages,
    )


@pytest.mark.slow
@pytest.mark.parametrize("stages,width", [(2, 2), (3, 2)])
def test_replicated_reference_executor_matches_2bw_reference(stages, width):
    result = check(_run(m=8, stages=stages, width=width), "2bw-reference", steps=4)
    assert result.passed, result.report(top=5)


def test_suite_check_cli(capsys):
    sets = [
        "stages=2",
        "model.layers=2",
        "model.hidden=32",
        "model.heads=2",
        "model.intermediate=64",
        "seq_len=8",
        "device=cpu",
        "num_micro_batches=2",
    ]
    args = ["check", "pipedream-2bw", "--against", "2bw-reference", "--steps", "3"]
    assert cli.main(args + [x for s in sets for x in ("--set", s)]) == 0
    assert "PASS" in capsys.readouterr().out
