"""The estimate prices the runner's own plan: for every campaign stage, the cells and decisions the estimate lists
are exactly those the runner's plan makes from the same records, and the runner launches the cell-rounds in the
order the estimate costs them (Plan.passes)."""

import json

import pytest

from suite.commands.campaign.estimate import DEFAULT_RAM, estimate
from suite.commands.campaign.stages import STAGES
from suite.core import precount, registry, runner
from suite.core.experiment import get_experiment
from suite.core.recorder import Recorder
from suite.measure.provenance import versions
from suite.measure.step import METHODOLOGY_VERSION

MACHINE = "h100-plan"


def _ok(cell, throughput=10.0):
    prov = {"methodology": METHODOLOGY_VERSION, **cell.code}
    return {"status": "ok", "metrics": {"throughput": throughput, "memory_gb": 1.0}, "error": None, "provenance": prov}


class Launches:
    """A launcher that runs nothing: each cell-round it is given, in order, succeeds at once."""

    def __init__(self):
        self.log = []

    def run(self, cell, timeout=None):
        self.log.append(f"{cell.experiment}/{cell.row.name}")
        return _ok(cell)

    def close(self, completed):
        pass


def _seed(results_dir, monkeypatch, stage):
    """The target's records as a campaign finds them: finished cells, a partial one to resume, a reference row of
    an older sweep, counts stored for every capped cell (some past their caps), and no DeepSpeed (as the GPU
    image): the estimate reads its environment report, the runner its own registry."""
    torch_v, transformers_v = versions()
    env = results_dir / "campaign" / MACHINE / "environment.json"
    env.parent.mkdir(parents=True)
    machine = {"torch": torch_v, "transformers": transformers_v}
    env.write_text(json.dumps({"machine": machine, "versions": {"deepspeed": None}}))
    # The runner's host, as the estimate takes the target's where its report does not say (the host-memory refusal)
    monkeypatch.setattr(runner.host, "ram_bytes", lambda: DEFAULT_RAM)
    for name in registry.names():
        cls = registry.get(name)
        if "deepspeed" in cls.requires:
            monkeypatch.setattr(cls, "unavailable", classmethod(lambda c: "deepspeed not installed"))
    prov = {"torch": torch_v, "transformers": transformers_v}
    past = {("table5", "baseline-x16"), ("table5", "stash-gpu-x16"), ("table3", "amp-u1")}
    for s in stage.sweeps:
        for cell in precount.capped(precount.as_on_gpu(get_experiment(s.experiment), None)):
            status = "oom" if (cell.experiment, cell.row.name) in past else "ok"
            code = precount.count_of(cell).code["code"]
            precount.save(results_dir, cell, {"status": status, "metrics": {}, "provenance": {**prov, "code": code}})
    records = {
        "table3": [
            ("l2l-cmp-u2", _ok),  # finished: reused
            ("amp-rc-u1", lambda c: {**_ok(c), "status": "partial: 1/3 rounds", "round_records": [_ok(c)]}),  # resumed
        ],
        "table2": [("baseline-fp32", _ok), ("l2l-cmp", _ok)],  # another sweep's reference: measured again
    }
    for s in stage.sweeps:
        req = s.request(results_dir=results_dir, as_on_gpu=True)
        for row, outcome in records.get(s.experiment, []):
            (cell,) = precount.as_on_gpu(req.experiment, [row])
            Recorder(req, {"slug": MACHINE}, "old", print).save(cell, outcome(cell))


@pytest.mark.parametrize("number", sorted(n for n, s in STAGES.items() if s.sweeps))
def test_the_estimate_lists_exactly_the_cells_and_decisions_the_runners_plan_makes(number, tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", MACHINE)
    _seed(tmp_path, monkeypatch, STAGES[number])
    stage = STAGES[number]
    lines = [ln for ln in estimate({number: stage}, MACHINE, results_dir=tmp_path) if ln.decision]
    plans, launched = [], Launches()
    real_plan = runner.plan

    def plan(*args, **kwargs):
        plans.append(real_plan(*args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(runner, "plan", plan)
    monkeypatch.setattr(runner, "choose", lambda *a: launched)
    monkeypatch.setattr(runner.launcher, "run_cell", lambda *a: pytest.fail("a count ran: every one was stored"))
    for s in stage.sweeps:  # as the campaign's stage runs them, one after another
        runner.run_cells(s.request(results_dir=tmp_path, as_on_gpu=True), progress=lambda line: None)
    decided = [(f"{d.cell.experiment}/{d.cell.row.name}", d.action, d.rounds) for p in plans for d in p.decisions]
    assert [(ln.what, ln.decision, ln.rounds) for ln in lines] == decided
    # every kind of decision the seeded records call for, in the stages that hold them
    actions = {a for _, a, _ in decided}
    want = {2: {"run", "reused", "resume", "twin", "past its cap", "not run"}, 3: {"run", "not run"}}
    assert want.get(number, {"run"}) <= actions, actions
    if number == 3:  # table2's reference row, finished in another sweep, is measured again first
        assert decided[0][:2] == ("table2/baseline-fp32", "run")
    order = [f"{c.experiment}/{c.row.name}" for p in plans for cells in p.passes() for c in cells]
    assert launched.log == order and order  # the runner launches what the estimate costs, in the same order
    priced = {ln.what for ln in lines if ln.seconds > 0}
    assert priced == {what for what, action, _ in decided if action in ("run", "resume")}
