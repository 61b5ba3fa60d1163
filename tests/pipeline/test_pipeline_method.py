"""PipelineMethod: registration, options, world size, partition, configuration errors, per-step action ids."""

import dataclasses

import pytest

from methods.pipeline.method import PipelineMethod, step_actions
from methods.pipeline.schedules.schedule import FORWARD, OPTIMIZER_STEP, gpipe
from suite.config.errors import ConfigError
from suite.config.run import ModelConfig, RunConfig, apply_overrides
from suite.core import registry
from suite.core.check import build_method

MODEL = ModelConfig(layers=2, hidden=32, heads=2, intermediate=64)


def _run(method, **opts):
    return RunConfig(
        method=method, model=MODEL, seq_len=8, micro_batch_size=4, num_micro_batches=4, device="cpu", options=opts
    ).validate()


def test_registered_with_their_papers_defaults():
    gp, fl = registry.get("gpipe"), registry.get("pipedream-flush")
    assert issubclass(gp, PipelineMethod) and issubclass(fl, PipelineMethod)
    assert gp.options["recompute"].default is True and fl.options["recompute"].default is False
    assert gp.schedule_name == "gpipe" and fl.schedule_name == "1f1b"
    assert gp.shards_batch is False and gp.precisions == ("fp32",)
    for cls in (gp, fl):
        assert set(cls.options) == {"executor", "stages", "width", "recompute", "timeout", "timeline"}
        assert cls.options["stages"].default == 2 and cls.options["width"].default == 1


def test_world_size_and_options_from_the_command_line():
    cls = registry.get("pipedream-flush")
    run = apply_overrides(
        RunConfig(method="pipedream-flush"), ["executor=dist", "stages=3", "width=2", "recompute=on"], cls.options
    )
    assert run.options == {"executor": "dist", "stages": 3, "width": 2, "recompute": True}
    assert cls.world_size(run) == 6
    assert cls.world_size(_run("pipedream-flush", stages=3, width=2)) == 1  # reference: one process
    with pytest.raises(ConfigError, match="executor"):
        apply_overrides(RunConfig(method="gpipe"), ["executor=mpi"], cls.options)


def test_partition_by_parameter_count_and_state_dict_names():
    method = build_method(_run("gpipe", stages=3))
    # Parameters [36992, 8544, 8544, 1122]: the embeddings alone bound the slowest stage.
    assert method.ranges == [range(0, 1), range(1, 2), range(2, 4)]
    assert [st.layers for st in method.stages] == method.ranges
    ref = build_method(_run("grad_accum"))
    assert method.state_dict().keys() == ref.state_dict().keys()
    assert method.resident_device_bytes() > 0


@pytest.mark.parametrize(
    "opts,match",
    [({"stages": 5}, "stages=5"), ({"width": 3}, "width=3"), ({"executor": "dist"}, "torch.distributed.run")],
)
def test_configuration_errors_name_the_fix(opts, match, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match=match):
        build_method(_run("pipedream-flush", **opts))
    with pytest.raises(ConfigError, match="ranks=2"):
        build_method(dataclasses.replace(_run("gpipe"), ranks=2))


def test_step_actions_number_micro_batches_and_versions_across_the_run():
    sch = gpipe(2, 3, 1)
    acts = step_actions(sch, 2)
    assert [a.mb for a in acts[0] if a.kind is FORWARD] == [6, 7, 8]
    assert {a.version for a in acts[1] if a.kind is FORWARD} == {2}
    assert [a.version for a in acts[1] if a.kind is OPTIMIZER_STEP] == [3]
    # Shifting each step reproduces the multi-step schedule's actions exactly.
    multi = gpipe(2, 3, 3)
    assert [x for t in range(3) for x in step_actions(sch, t)[0]] == multi.actions[0]
