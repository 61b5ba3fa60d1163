"""`make pipeline-timelines`: simulated and measured (4 gloo ranks) timelines of GPipe and PipeDream-Flush."""

import json

import pytest

from experiments import pipeline_timelines as timelines
from methods.pipeline.schedules.schedule import COMPUTE, Kind


@pytest.mark.slow
def test_timelines_script_draws_simulated_and_measured(tmp_path):
    assert timelines.main(["--out", str(tmp_path)]) == 0
    for name in ("gpipe", "pipedream-flush"):
        for kind in ("simulated", "measured"):
            assert (tmp_path / f"pipeline_{name}_{kind}.png").stat().st_size > 10_000
        trace = json.loads((tmp_path / f"pipeline_{name}_measured.trace.json").read_text())
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        compute = [e for e in events if Kind(e["cat"]) in COMPUTE]
        assert len(compute) == 2 * timelines.D * timelines.M  # one F and one B per micro-batch per stage
        assert {e["tid"] for e in events} == set(range(timelines.D))
        assert {e["args"]["mb"] for e in compute} == set(range(timelines.M))  # relabelled to the drawn step
