"""The campaign's next loan unit (issue 51): what a lent GPU runs next at this code, in the order of what it settles,
with its estimate and the commands, so that the campaign converges at HEAD in 10-minute calls.

A unit is stage 1 (the cuda tests, isolation and counted-against-measured included) until the target's stage-1
report is done, then one table's complete section: every row its sweep still runs at this code (stale records
included: suite.core.plan) and its reference, in the rounds the table plans. The estimate is the campaign's own
(suite.commands.campaign.estimate), which prices exactly the runner's plan."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from suite.commands.campaign import stages
from suite.commands.campaign.estimate import estimate
from suite.config import paths
from suite.core.plan import RUNS
from suite.measure.provenance import git_commit, tree_digest

LIMIT_S = stages.BUDGET_S  # one call's budget: inside the GPU machine's 10-minute command limit, with a margin


def _stage1_done(results_dir: Path, machine: str | None) -> tuple[bool, str]:
    """Whether the target's stage-1 report says done, and what it says."""
    path = results_dir / "campaign" / (machine or "-") / "stage-1.json"
    if machine is None or not path.exists():
        return False, "no stage-1 report on the target"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return False, f"its stage-1 report is unreadable ({type(exc).__name__}): stage 1 runs again"
    if not isinstance(report, dict):
        return False, "its stage-1 report is not an object: stage 1 runs again"
    if report.get("done"):
        return True, f"stage 1 done at {str(report.get('suite_commit') or '?')[:7]}"
    left = ", ".join(report.get("left") or []) or "a test failed"
    return False, f"stage 1 not done at {str(report.get('suite_commit') or '?')[:7]} ({left})"


def next_unit(device: str = "h100", results_dir: Path | None = None, rounds: int | None = None) -> str:
    """What the target runs next, as lines: the unit, why it is next, its estimate against one call's budget, the
    counts it needs made before, and the command."""
    results_dir = Path(results_dir or paths.RESULTS_DIR)
    lines = estimate(stages.STAGES, device, rounds, True, results_dir)
    machine = _target(results_dir, device)
    commit, code = git_commit() or "<commit>", tree_digest()
    env = f"SUITE_COMMIT={commit} SUITE_DIRTY=0"
    head = f"next unit for {device} at tree {code} (commit {commit[:7]}; each record states its cell's own code):"
    done, said = _stage1_done(results_dir, machine)
    if not done:
        cost = sum(ln.seconds for ln in lines if ln.stage == 1)
        return "\n".join(
            [
                head,
                f"  stage 1 (cuda tests with the worker's isolation test, counted against measured): {said}",
                f"  estimated {cost:.0f} s of the {LIMIT_S:.0f} s a call has" + _fits(cost),
                f"  {env} python -m suite campaign --stage 1 --budget {LIMIT_S:.0f}",
            ]
        )
    for number, stage in stages.STAGES.items():
        for sweep in stage.sweeps:
            mine = [
                ln for ln in lines if ln.stage == number and ln.what.split("/")[0].split(":")[0] == sweep.experiment
            ]
            runs = [ln for ln in mine if ln.decision in RUNS]
            if not runs:
                continue
            cost = sum(ln.seconds for ln in mine)
            counts = next((ln for ln in mine if ln.what.endswith("counts of its capped cells")), None)
            tally = {d: sum(ln.decision == d for ln in runs) for d in RUNS}
            kinds = ", ".join(f"{n} {d}" for d, n in tally.items() if n)
            only = [f"--only {shlex.quote(r)}" for r in sweep.only or ()]
            out = [
                head,
                f"  {sweep.experiment}'s paper section (stage {number}): {len(runs)} cell(s) to measure ({kinds}), "
                f"{max(ln.rounds for ln in runs)} round(s); {said}",
                f"  estimated {cost:.0f} s of the {LIMIT_S:.0f} s a call has" + _fits(cost),
            ]
            if counts is not None and counts.seconds:
                out.append(f"  capped cells not all counted at this code: `make gpu-precount` first ({counts.source})")
            cmd = ["python -m suite run", sweep.experiment, "--profile paper --worker --precount --wandb off", *only]
            cmd += [f"--rounds {rounds}"] if rounds is not None else []
            out.append(f"  {env} {' '.join(cmd)}")
            return "\n".join(out)
    return f"{head}\n  nothing left: every section of the campaign is measured at this code on {machine or device}"


def _target(results_dir: Path, device: str) -> str | None:
    """The target machine's slug: its stage reports' folder."""
    found = sorted(p.parent.name for p in (results_dir / "campaign").glob(f"{device}*/environment.json"))
    return found[0] if found else None


def _fits(cost: float) -> str:
    if cost <= LIMIT_S:
        return ": fits one call"
    calls = int(cost // LIMIT_S) + 1
    return (
        f": more than one call; the same command resumes it in about {calls} calls (a unit cut short stays partial, "
        "resumed at this code only)"
    )
