"""Running the campaign: one stage until its work is done or its budget is spent, its report written."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from suite.commands.campaign import stages
from suite.commands.campaign.estimate import CUT, NOT_STARTED, estimate, part_line
from suite.commands.campaign.pytest_steps import BENCH_TESTS, COUNTED_TESTS, counted_line, run_cuda_tests, run_pytest
from suite.commands.campaign.report import StageReport, campaign_dir, environment, pack, summary_line
from suite.commands.sweep import sweep
from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.files import write_atomic
from suite.core.worker_client import close_shared_worker
from suite.measure.machine import fingerprint
from suite.records.schema import status_of


@dataclass(frozen=True)
class StageRequest:
    """One stage's call: its number, the CPU rehearsal (`dry`: tiny shapes, a scratch folder) or the GPU's, its
    budget in seconds, where records go, timing rounds (else the experiments'), W&B, a folder for a copy of the
    results (a lent machine's $OUT), and whether single-rank cells share the worker."""

    number: int
    dry: bool = False
    budget: float = stages.BUDGET_S
    results_dir: Path | None = None
    rounds: int | None = None
    wandb_mode: str | None = "off"
    out: str | None = None
    worker: bool = True


def run_stage(req: StageRequest, progress=print) -> StageReport:
    """Run one stage until its work is done or its budget is spent; write its report (and a copy under `out`)."""
    number, dry = req.number, req.dry
    if number not in stages.STAGES:
        raise ConfigError(f"--stage {number}: the campaign has stages {sorted(stages.STAGES)} (or 'all')")
    # The rehearsal's tiny records must never pass for a table's own: they go to a scratch folder.
    results_dir = Path(
        req.results_dir or (Path(paths.RESULTS_DIR) / ".cache" / "campaign-dry" if dry else paths.RESULTS_DIR)
    )
    stage, started = stages.STAGES[number], time.time()
    deadline = started + req.budget
    fp = fingerprint()
    if not dry and fp["gpu"] is None:
        raise ConfigError(
            f"stage {number} needs a CUDA device and this machine has none ({fp['slug']}); "
            "give --dry for the CPU rehearsal at tiny shapes"
        )
    here = campaign_dir(results_dir, fp["slug"])
    here.mkdir(parents=True, exist_ok=True)
    profile = "tiny" if dry else "paper"
    report = StageReport(
        stage=number,
        title=stage.title,
        dry=dry,
        profile=profile,
        machine=fp["slug"],
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        budget_s=req.budget,
        suite_commit=os.environ.get("SUITE_COMMIT"),
    )
    progress(f"stage {number}: {stage.title} ({'dry run, tiny' if dry else 'paper'} on {fp['slug']})")
    need: dict[str, float] = {}  # each part's estimated seconds: a part that cannot fit waits whole for the next call
    if not dry:  # what the estimate said beside what the stage took, for the next estimate to be judged by
        lines = [
            ln for ln in estimate(stages.STAGES, fp["slug"], req.rounds, req.worker, results_dir) if ln.stage == number
        ]
        report.estimate_s = round(sum(ln.seconds for ln in lines), 1)
        report.estimate = [vars(ln) for ln in lines]
        need = {ln.what: ln.seconds for ln in lines}

    def fits(key: str, label: str) -> bool:
        """Whether the part `key` (its estimate line) fits the time left; if not it is left whole for the next call,
        never started to be cut at the deadline, and its report says what it needs (the next estimate's lower
        bound)."""
        left, needs = deadline - time.time(), need.get(part_line(key), 0.0)
        if left > 0 and needs <= left:
            return True
        report.left.append(label)
        setattr(report, key, {"exit": NOT_STARTED, "seconds": round(needs, 1)})
        why = f"it needs about {needs:.0f} s, {max(left, 0):.0f} s remain"
        if needs > req.budget:
            why += f"; more than the stage's whole budget: give --budget {needs * 1.1:.0f} or more"
        progress(f"stage {number} | {label} | left for the next call: {why}")
        return False

    if number == 1:
        env = environment(fp)
        write_atomic(here / "environment.json", json.dumps(env, indent=1, default=str))
        progress(env["described"])
    if stage.cuda_tests and fits("cuda_tests", "cuda tests"):
        extra = ["--collect-only"] if dry else []
        report.cuda_tests = t = run_cuda_tests(here, extra, deadline)
        if t["exit"] == CUT:  # what it did not reach runs again in the next call
            report.left.append("cuda tests (cut at the deadline)")
        progress(
            f"stage {number} | cuda tests | "
            + (counted_line(t) + f" in {t['seconds']}s" if not dry else f"dry: {t['collected']} collected, not run")
            + (f" (exit {t['exit']})" if t["exit"] not in (0, 5) and not dry else "")
        )
    for s in stage.sweeps:
        run_sweep(s, req, report, results_dir, deadline, progress)
    if stage.bench and fits("bench", "L2L microbenchmarks"):
        extra = ["--collect-only"] if dry else ["--benchmark-only", f"--benchmark-json={here / 'bench.json'}"]
        report.bench = run_pytest(BENCH_TESTS, "not slow", here / "bench.xml", extra, deadline - time.time())
        if report.bench["exit"] == CUT:
            report.left.append("L2L microbenchmarks (cut at the deadline)")
        progress(f"stage {number} | L2L microbenchmarks | exit {report.bench['exit']}")
    if stage.counted and fits("counted_vs_measured", "counted against measured"):
        extra = ["--collect-only"] if dry else []
        got = run_pytest(COUNTED_TESTS, "cuda", here / "counted.xml", extra, deadline - time.time())
        report.counted_vs_measured = got
        if got["exit"] == CUT:  # the H200's stage of 2026-11-27 listed nothing left after cutting it
            report.left.append("counted against measured (cut at the deadline)")
        progress(f"stage {number} | counted against measured | {counted_line(got)} (exit {got['exit']})")
    report.finish(time.time() - started)
    if report.estimate_s is not None:
        progress(f"stage {number}: estimated {report.estimate_s:.0f} s, took {report.seconds:.0f} s")
    write_atomic(here / f"stage-{number}.json", report.to_json())
    progress(
        f"stage {number}: {'done' if report.done else 'not done'} in {report.seconds}s"
        + (f"; left for the next call: {', '.join(report.left)}" if report.left else "")
    )
    if req.out:
        progress(f"copied to {pack(results_dir, fp['slug'], number, Path(req.out))}")
    return report


def run_sweep(s: stages.Sweep, req: StageRequest, report: StageReport, results_dir, deadline, progress):
    """One of the stage's sweeps, unless its deadline has passed; each record's row in the report."""
    if time.time() >= deadline:
        report.left.append(s.experiment)
        return
    sweep_req = s.request(req.dry, req.rounds, req.worker, results_dir, deadline, req.wandb_mode)
    exp, profile, only = sweep_req.experiment, sweep_req.profile, sweep_req.only
    records = sweep(sweep_req, progress)
    for row in exp.rows(profile):
        if row.skip and (only is None or row.name in only):  # a row with no cell here says why
            report.cells.append({"experiment": s.experiment, "row": row.name, "status": f"skipped: {row.skip}"})
            progress(f"stage {report.stage} | {s.experiment}/{row.name} | skipped: {row.skip}")
    for record in records:  # each names its row and key (a reference row the sweep added among them)
        row = record["row"]
        progress(summary_line(report.stage, s.experiment, record, row))
        report.cells.append(
            {"experiment": s.experiment, "row": row, "key": record["key"], "status": record.get("status")}
        )
        if status_of(record).unfinished:
            report.left.append(f"{s.experiment}/{row}")


def run(stage_text: str, **request) -> int:
    """`all` or one stage's number (`request`: StageRequest's other fields); 0 when every stage ran is done."""
    try:
        reports = [run_stage(StageRequest(n, **request)) for n in stages.stage_numbers(stage_text)]
    finally:
        close_shared_worker()
    return 0 if all(r.done for r in reports) else 1
