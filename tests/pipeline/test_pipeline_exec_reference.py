"""Reference executor: GPipe and PipeDream-Flush equal grad_accum through suite.core.check; stash at its bound."""

import dataclasses

import pytest
import torch

from methods.pipeline.executors.reference import ReferenceExecutor
from methods.pipeline.executors.stage import Stage
from methods.pipeline.schedules.schedule import Kind, two_bw
from methods.pipeline.schedules.simulate import Timeline
from suite.commands import cli
from suite.config.run import ModelConfig, RunConfig
from suite.core.check import build_method, check
from suite.harness.data import synthetic_batches

MODEL = ModelConfig(layers=2, hidden=32, heads=2, intermediate=64)  # 4 layers: embeddings, 2 blocks, head


def _run(method, m=4, **opts):
    return RunConfig(
        method=method,
        model=MODEL,
        seq_len=8,
        micro_batch_size=4,
        num_micro_batches=m,
        device="cpu",
        options={"executor": "reference", **opts},
    )


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("method", ["gpipe", "pipedream-flush"])
def test_check_against_grad_accum(method, stages, recompute):
    result = check(_run(method, stages=stages, recompute=recompute), "grad_accum", steps=3)
    assert result.passed, result.report(top=5)
    # One process, same micro-batches, same accumulation order: the same bits as grad_accum.
    assert result.worst[1] == 0.0, result.report(top=5)
    assert all(a == b for a, b in result.losses)


@pytest.mark.parametrize("method,stages,width", [("pipedream-flush", 2, 2), ("gpipe", 3, 2), ("pipedream-flush", 2, 4)])
def test_replicated_stages_check_against_grad_accum(method, stages, width):
    result = check(_run(method, m=8, stages=stages, width=width, recompute=False), "grad_accum", steps=3)
    assert result.passed, result.report(top=5)
    # Replicas take consecutive micro-batches and run one after another: grad_accum's order, same bits.
    assert result.worst[1] == 0.0, result.report(top=5)


@pytest.mark.parametrize("method,bound", [("gpipe", lambda d, s, m: m), ("pipedream-flush", lambda d, s, m: d - s)])
@pytest.mark.parametrize("stages,width", [(2, 1), (4, 1), (2, 2)])
def test_measured_peak_stash_equals_validator_bound(method, bound, stages, width):
    run = _run(method, m=8, stages=stages, width=width).validate()
    subject = build_method(run)
    batches = synthetic_batches(run)
    for _ in range(2):
        subject.step(next(batches))
    m = subject.m
    assert subject.stash_peaks() == subject.report.peak_stash == subject.report.stash_bound
    assert subject.stash_peaks() == [bound(stages, s, m) for s in range(stages)]
    assert all(not st.stash for st in subject.stages)  # everything stashed was consumed
    # Each replica on its own reaches the bound too.
    assert all(st.peak[r] == p for st, p in zip(subject.stages, subject.stash_peaks()) for r in range(width))


def test_records_build_a_timeline_with_global_ids_and_versions():
    run = _run("pipedream-flush", stages=3).validate()
    subject = build_method(run)
    batches = synthetic_batches(run)
    subject.step(next(batches))
    subject.step(next(batches))
    recs = subject.timeline_records()
    tl = Timeline.from_records(recs)
    assert tl.d == 3 and tl.peak_stash == [3, 2, 1]
    fwd = sorted(r["mb"] for r in recs if r["kind"] == "FORWARD" and r["stage"] == 0)
    assert fwd == [4, 5, 6, 7]  # second step: global micro-batch ids
    assert {r["version"] for r in recs if r["kind"] in ("FORWARD", "BACKWARD")} == {1}
    assert [r["version"] for r in recs if r["kind"] == "OPTIMIZER_STEP"] == [2, 2, 2]
    assert all(r["end"] >= r["start"] for r in recs)


def test_gradients_without_update_equal_grad_accums():
    run = _run("gpipe", stages=3, recompute=True).validate()
    subject = build_method(run)
    ref = build_method(dataclasses.replace(run, method="grad_accum", options={}))
    batch = next(synthetic_batches(run))
    before = subject.state_dict()
    loss = subject.gradients(batch)
    for mb in batch.split(run.num_micro_batches):
        ref.model.forward_micro_batch(ref.model.begin(mb, run.seed, 0, batch.size)).backward()
    mine = {n: p.grad for st in subject.stages for named in st.named for n, p in named}
    theirs = {n: p.grad for named in ref.layer_params for n, p in named}
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert loss > 0 and subject.step_count == 0
    assert all(torch.equal(before[k], v) for k, v in subject.state_dict().items())


def test_clip_grad_norm_matches_grad_accum():
    run = dataclasses.replace(_run("pipedream-flush", stages=3), clip_grad_norm=0.05)
    result = check(run, "grad_accum", steps=3)
    assert result.passed, result.report(top=5)


def test_a_wrong_gradient_fails_the_check(monkeypatch):
    """The oracle can fail: a stage that scales its input gradient by 1.001 is caught."""
    original = Stage.backward

    def skewed(self, key, grad):
        g = original(self, key, grad)
        return None if g is None else g * 1.001

    monkeypatch.setattr(Stage, "backward", skewed)
    result = check(_run("pipedream-flush", stages=2), "grad_accum", steps=2)
    assert not result.passed


def test_two_bw_versions_are_refused_and_deadlocks_reported():
    run = _run("pipedream-flush", stages=2).validate()
    subject = build_method(run)
    ctxs = subject._contexts(next(synthetic_batches(run)))[0]
    ctxs.update({mb + 4: ctx for mb, ctx in ctxs.items()})
    # 2BW runs micro-batch 4 on version 0 after the update to version 1: it needs weight stashing.
    with pytest.raises(RuntimeError, match="wants weight version 0 but the stage holds version 1"):
        ReferenceExecutor(subject.stages).run(two_bw(2, 4, 2).actions, [ctxs])
    fresh = build_method(run)
    s0, s1 = fresh.schedule.actions
    first_recv = next(i for i, a in enumerate(s0) if a.kind is Kind.RECV_GRAD)
    cyclic = [[s0[first_recv]] + s0[:first_recv] + s0[first_recv + 1 :], s1]  # waits for a gradient first
    with pytest.raises(RuntimeError, match="deadlock: replica 0 stage 0 at <g0; replica 0 stage 1 at <a0"):
        ReferenceExecutor(fresh.stages).run(cyclic, [ctxs])
    with pytest.raises(RuntimeError, match="which no earlier action produced"):
        ReferenceExecutor(build_method(run).stages).run([[s0[1], s0[0]] + s0[2:], s1], [ctxs])  # >a0 before F0


def test_suite_check_cli_runs_the_reference_executor(capsys):
    sets = [
        "stages=3",
        "model.layers=2",
        "model.hidden=32",
        "model.heads=2",
        "model.intermediate=64",
        "seq_len=8",
        "device=cpu",
        "num_micro_batches=4",
    ]
    args = ["check", "gpipe", "--steps", "2"] + [x for s in sets for x in ("--set", s)]
    assert cli.main(args) == 0
    assert "PASS" in capsys.readouterr().out
