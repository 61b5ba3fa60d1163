"""The GPU campaign: a lent GPU's minutes turned into committed results, in resumable stages of one command each."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from suite.config import paths
from suite.config.errors import ConfigError
from suite.core.experiment import Cell, get_experiment
from suite.core.request import SweepRequest
from suite.core.worker_client import close_shared_worker
from suite.estimate import estimate
from suite.measure.machine import describe, fingerprint
from suite.records.schema import Record
from suite.sweep import sweep

BUDGET_S = 540.0  # a stage's default: inside the GPU machine's 10-minute command limit, with a margin
# The tests that need CUDA: equivalence at FP32 (TF32 off), L2L-CMP, the copy/compute overlap seen by CUDA
# events, pinned asynchronous copies, the emulated cap's OOM recorded as `oom`, NCCL where two GPUs exist; the
# Triton kernels (keyed dropout, attention, device LAMB) compiled and held to their eager references.
CUDA_TESTS = (
    "tests/test_cuda_kernels.py",
    "tests/test_device_lamb.py",
    "tests/test_cuda.py",
    "tests/l2l/test_l2l_cuda.py",
    "tests/pipeline/test_pipeline_exec_cuda.py",
    "tests/test_campaign_cuda.py",
)
COUNTED_TESTS = ("tests/test_counting_cuda.py",)  # counted against CUDA's allocator, in stage 1
# Its cells: Table 2's rows at a BERT-base shape, each measured on CUDA and counted beside it (the estimate costs
# them too).
COUNTED_SHAPE = ("device=cuda", "model.preset=bert-base", "seq_len=256", "model.layers=8", "warmup=1", "steps=1")
COUNTED_ROWS = {
    "baseline-fp32": ("micro_batch_size=4", "num_micro_batches=2"),
    "baseline-amp": ("micro_batch_size=4", "num_micro_batches=2", "precision=fp16"),
    "l2l-fp32": ("micro_batch_size=8",),
    "l2l-cmp": ("micro_batch_size=8", "stash=cpu", "precision=fp16"),
}
BENCH_TESTS = ("tests/l2l/test_l2l_bench.py",)  # pytest-benchmark: the host update per parameter, an L2L step on CUDA
JUNIT = {"failure": "failed", "error": "errors", "skipped": "skipped"}


def counted_cells() -> list[Cell]:
    """The counted-against-measured test's cells (tests/test_counting_cuda.py), one per row of COUNTED_ROWS."""
    table2 = get_experiment("table2")
    return [table2.cells("tiny", [row], [*COUNTED_SHAPE, *extra])[0] for row, extra in COUNTED_ROWS.items()]


@dataclass(frozen=True)
class Sweep:
    """One experiment's cells at the campaign's profile (`only` rows, or all); `dry_only` rows and `dry_set`
    overrides at the dry run."""

    experiment: str
    only: tuple[str, ...] | None = None
    dry_only: tuple[str, ...] = ()
    dry_set: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stage:
    """What one call of at most BUDGET_S seconds runs, in order; a stage cut at its deadline resumes."""

    title: str
    sweeps: tuple[Sweep, ...] = ()
    cuda_tests: bool = False
    bench: bool = False
    counted: bool = False
    counted_cells: Callable[[], list[Cell]] | None = None  # what the counted test runs (for the estimate)
    notes: tuple[str, ...] = field(default=())


# In the order of what a lent GPU's minutes are worth (the tests first, then inner looping, the paper's headline
# table, depth), each stage one command; a session of 15 device minutes runs stage 1 and one or two more.
STAGES = {
    1: Stage(
        "environment report, every cuda test, counted against measured, L2L's microbenchmarks",
        cuda_tests=True,
        counted=True,
        counted_cells=counted_cells,
        bench=True,
    ),
    2: Stage(
        "L2L Table 3 (inner looping against AMP recomputing per layer), Table 4's one-GPU rows and Table 6, "
        "paper profile (BERT-Large shapes, random weights) under the 16 GB cap",
        sweeps=(
            Sweep("table3", dry_only=("l2l-cmp-u1",)),
            Sweep("table4", only=("1-rank-u1", "1-rank-u2", "1-rank-u4"), dry_only=("1-rank-u1",)),
            Sweep("table6", dry_only=("turing-17b",)),
        ),
    ),
    3: Stage(
        "L2L Table 2 with the relay's settings varied in the same rounds, and the host-optimizer benchmark",
        sweeps=(
            Sweep("table2", dry_only=("baseline-fp32", "l2l-cmp-overlap")),
            # The layer rows only: the whole model's rows take minutes of host time each, past a stage's budget
            # (`suite run bench-host-optim --only 'model-*'` runs them on their own).
            Sweep("bench-host-optim", only=("layer-1-thread", "layer-all-threads"), dry_only=("layer-1-thread",)),
        ),
    ),
    4: Stage(
        "L2L Table 5 to 384 layers and the harness's overhead benchmark",
        sweeps=(
            Sweep("table5", dry_only=("stash-cpu-x1",)),
            Sweep("bench-overhead", dry_set=("steps=2", "warmup=1", "rounds=2")),
        ),
    ),
    5: Stage(
        "Llama 3.2 1B and 3B at 4096 tokens in bf16 (AMP, L2L-CMP, FSDP2), 80 GB: tokens/s, TFLOPS, MFU",
        sweeps=(
            Sweep(
                "decoder",
                # The precision Llama trains in: the FP32 rows (AG, L2L) stay counted (results/decoder.md); on a GPU
                # `python -m suite run decoder --profile paper --only '1b-ag-fp32-80GB'` measures one.
                only=tuple(f"{size}-{m}-80GB" for size in ("1b", "3b") for m in ("amp", "l2l-cmp", "fsdp")),
                dry_only=("1b-l2l-cmp-80GB",),
                dry_set=("model.preset=llama-tiny", "seq_len=32"),
            ),
        ),
    ),
}


def campaign_dir(results_dir: Path, machine: str) -> Path:
    """Where a machine's stage reports live, beside its records."""
    return results_dir / "campaign" / machine


def environment(fp: dict) -> dict:
    """The report stage 1 writes: the machine, its GPU as nvidia-smi sees it, and the versions that matter."""
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        smi = "nvidia-smi: not available"
    versions = {}
    for pkg in ("torch", "transformers", "datasets", "wandb", "deepspeed", "pytest", "pytest-benchmark", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:  # absent is an answer (the GPU image: no datasets, wandb, DeepSpeed)
            versions[pkg] = None
    return {
        "machine": fp,
        "described": describe(fp),
        "python": sys.version,
        "platform": platform.platform(),
        "versions": versions,
        "nvidia_smi": smi,
        "suite_commit": os.environ.get("SUITE_COMMIT"),
    }


def _pytest(files: tuple[str, ...], marker: str, report: Path, extra: list[str], budget: float) -> dict:
    """Run pytest on `files` with `marker`; returns the counts from its junit report and its tail."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-m", marker, f"--junitxml={report}", *extra, *files]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.time()
    try:
        proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=max(budget, 30.0))
        tail, code = (proc.stdout + proc.stderr)[-6000:], proc.returncode
    except subprocess.TimeoutExpired as exc:
        tail, code = f"timeout after {budget:.0f}s: {str(exc.stdout or '')[-3000:]}", "timeout"
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    if report.exists():
        import xml.etree.ElementTree as ET

        for case in ET.parse(report).getroot().iter("testcase"):
            kids = {child.tag for child in case}
            # JUnit marks a case by its child element; none means it passed.
            counts[next((JUNIT[tag] for tag in JUNIT if tag in kids), "passed")] += 1
    collected = re.search(r"(\d+)(?:/\d+)? tests? collected", tail)
    counts["collected"] = int(collected.group(1)) if collected else None
    return {"command": " ".join(cmd), "exit": code, "seconds": round(time.time() - started, 1), **counts, "tail": tail}


def _summary_line(stage: int, exp: str, record: Record, row: str) -> str:
    m = record["metrics"]
    figures = ", ".join(
        f"{k} {m[k]:.4g}" for k in ("throughput", "memory_gb", "host_peak_gb") if isinstance(m.get(k), (int, float))
    )
    return f"stage {stage} | {exp}/{row} | {record['status']}" + (f" | {figures}" if figures else "")


def run_stage(
    number: int,
    dry: bool = False,
    budget: float = BUDGET_S,
    results_dir: Path | None = None,
    rounds: int | None = None,
    wandb_mode: str | None = "off",
    out: str | None = None,
    progress=print,
    worker: bool = True,
) -> dict:
    """Run one stage until its work is done or its budget is spent; write its report (and a copy under `out`)."""
    if number not in STAGES:
        raise ConfigError(f"--stage {number}: the campaign has stages {sorted(STAGES)} (or 'all')")
    # The rehearsal's tiny records must never pass for a table's own: they go to a scratch folder.
    results_dir = Path(
        results_dir or (Path(paths.RESULTS_DIR) / ".cache" / "campaign-dry" if dry else paths.RESULTS_DIR)
    )
    stage, started = STAGES[number], time.time()
    deadline = started + budget
    fp = fingerprint()
    if not dry and fp["gpu"] is None:
        raise ConfigError(
            f"stage {number} needs a CUDA device and this machine has none ({fp['slug']}); "
            "give --dry for the CPU rehearsal at tiny shapes"
        )
    here = campaign_dir(results_dir, fp["slug"])
    here.mkdir(parents=True, exist_ok=True)
    profile = "tiny" if dry else "paper"
    report: dict = {
        "stage": number,
        "title": stage.title,
        "dry": dry,
        "profile": profile,
        "machine": fp["slug"],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "budget_s": budget,
        "suite_commit": os.environ.get("SUITE_COMMIT"),
        "cells": [],
        "left": [],
    }
    progress(f"stage {number}: {stage.title} ({'dry run, tiny' if dry else 'paper'} on {fp['slug']})")
    need: dict[str, float] = {}  # each part's estimated seconds: a part that cannot fit waits whole for the next call
    if not dry:  # what the estimate said beside what the stage took, for the next estimate to be judged by
        lines = [ln for ln in estimate(STAGES, fp["slug"], rounds, worker, results_dir) if ln.stage == number]
        report["estimate_s"] = round(sum(ln.seconds for ln in lines), 1)
        report["estimate"] = [vars(ln) for ln in lines]
        need = {ln.what: ln.seconds for ln in lines}

    def fits(part: str, label: str) -> bool:
        """Whether `part` (its estimate line) fits the time left; if not it is left whole for the next call, never
        started to be cut at the deadline."""
        left = deadline - time.time()
        if left > 0 and need.get(part, 0.0) <= left:
            return True
        report["left"].append(label)
        progress(f"stage {number} | {label} | left for the next call: it needs about {need.get(part, 0):.0f} s, "
                 f"{max(left, 0):.0f} s remain")  # fmt: skip
        return False

    if number == 1:
        env = environment(fp)
        (here / "environment.json").write_text(json.dumps(env, indent=1, default=str))
        progress(env["described"])
    if stage.cuda_tests and fits("cuda tests", "cuda tests"):
        marker, extra = ("cuda", []) if not dry else ("cuda", ["--collect-only"])
        report["cuda_tests"] = _pytest(CUDA_TESTS, marker, here / "cuda-tests.xml", extra, deadline - time.time())
        t = report["cuda_tests"]
        progress(
            f"stage {number} | cuda tests | {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped in {t['seconds']}s"
            + (f" (dry: {t['collected']} collected, not run)" if dry else "")
        )
    for s in stage.sweeps:
        exp = get_experiment(s.experiment)
        only = list(s.dry_only) if dry else (list(s.only) if s.only else None)
        overrides = list(s.dry_set) if dry else None
        if time.time() >= deadline:
            report["left"].append(s.experiment)
            continue
        req = SweepRequest(
            exp,
            profile=profile,
            only=only,
            overrides=overrides,
            wandb_mode=wandb_mode,
            results_dir=results_dir,
            rounds=1 if dry else rounds,
            deadline=deadline,
            worker=worker,
            precount=True,
        )
        records = sweep(req, progress)
        for row in exp.rows(profile):
            if row.skip and (only is None or row.name in only):  # a row with no cell here says why
                report["cells"].append({"experiment": s.experiment, "row": row.name, "status": f"skipped: {row.skip}"})
                progress(f"stage {number} | {s.experiment}/{row.name} | skipped: {row.skip}")
        for record in records:  # each names its row and key (a reference row the sweep added among them)
            row = record["row"]
            progress(_summary_line(number, s.experiment, record, row))
            report["cells"].append(
                {"experiment": s.experiment, "row": row, "key": record["key"], "status": record.get("status")}
            )
            if str(record.get("status", "")).startswith(("pending", "partial")):
                report["left"].append(f"{s.experiment}/{row}")
    if stage.bench and fits("bench", "L2L microbenchmarks"):
        extra = ["--collect-only"] if dry else ["--benchmark-only", f"--benchmark-json={here / 'bench.json'}"]
        report["bench"] = _pytest(BENCH_TESTS, "not slow", here / "bench.xml", extra, deadline - time.time())
        progress(f"stage {number} | L2L microbenchmarks | exit {report['bench']['exit']}")
    if stage.counted and fits("counted vs measured", "counted against measured"):
        extra = ["--collect-only"] if dry else []
        got = _pytest(COUNTED_TESTS, "cuda", here / "counted.xml", extra, deadline - time.time())
        report["counted_vs_measured"] = got
        progress(f"stage {number} | counted against measured | {got['passed']} passed, {got['failed']} failed")
    report["seconds"] = round(time.time() - started, 1)
    if "estimate_s" in report:
        progress(f"stage {number}: estimated {report['estimate_s']:.0f} s, took {report['seconds']:.0f} s")
    report["done"] = not report["left"] and all(
        (report.get(k) or {}).get("exit") in (0, None) for k in ("cuda_tests", "bench", "counted_vs_measured")
    )
    (here / f"stage-{number}.json").write_text(json.dumps(report, indent=1, default=str))
    progress(
        f"stage {number}: {'done' if report['done'] else 'not done'} in {report['seconds']}s"
        + (f"; left for the next call: {', '.join(report['left'])}" if report["left"] else "")
    )
    if out:
        progress(f"copied to {pack(results_dir, fp['slug'], number, Path(out))}")
    return report


def pack(results_dir: Path, machine: str, number: int, out: Path) -> Path:
    """One archive of this machine's records, stage reports and the tables, for a lent machine's $OUT."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"campaign-{machine}-stage-{number}.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for sub in (Path("runs") / machine, Path("campaign") / machine):
            if (results_dir / sub).exists():
                tar.add(results_dir / sub, arcname=str(Path("results") / sub))
        for table in sorted(results_dir.glob("*.md")) + sorted(results_dir.glob("*.csv")):
            tar.add(table, arcname=str(Path("results") / table.name))
    return path


def precount_stages(stages: str, results_dir=None, timeout: float = 1800.0, progress=print) -> int:
    """Count every capped cell of the stages (`all` or one) as the GPU will resolve it (`device=cuda`), on this
    machine's cores, and store each count under results/campaign/precount/ for the GPU's sweeps to take
    (suite.core.precount). Run it where torch and transformers are the GPU image's (`make gpu-precount`: the mimic
    environment) at the commit the GPU will run, with a clean tree. Returns 0 when every count finished."""
    from concurrent.futures import ThreadPoolExecutor

    from suite.core import precount
    from suite.core.launcher import run_cell
    from suite.measure.provenance import code_digest, versions

    results_dir = Path(results_dir or paths.RESULTS_DIR)
    numbers = sorted(STAGES) if stages == "all" else [_stage_number(stages)]
    mine = (code_digest(), *versions())
    cells = []
    for n in numbers:
        for s in STAGES[n].sweeps:
            exp = get_experiment(s.experiment)
            got = precount.as_on_gpu(exp, list(s.only) if s.only else None)
            cells += [c for c in precount.capped(got) if precount.load(results_dir, c, *mine) is None]
    progress(
        f"precount: {len(cells)} capped cell(s) of stage(s) {stages} to count for CUDA (torch {mine[1]}, "
        f"transformers {mine[2]}, code {mine[0]}), {os.cpu_count()} at a time"
    )
    failed = 0
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        futures = [(c, pool.submit(run_cell, precount.count_of(c), timeout)) for c in cells]
        for c, future in futures:
            got = future.result()
            precount.save(results_dir, c, got)
            failed += got["status"] not in ("ok", "oom")
            progress(f"precount | {c.experiment}/{c.row.name} | {got['status'].splitlines()[0]}")
    return 1 if failed else 0


def run(
    stages: str, dry: bool, budget: float, rounds: int | None, out: str | None, results_dir=None, worker: bool = True
) -> int:
    """`all` or one stage number; returns 0 when every stage ran is done."""
    numbers = sorted(STAGES) if stages == "all" else [_stage_number(stages)]
    try:
        reports = [run_stage(n, dry, budget, results_dir, rounds, out=out, worker=worker) for n in numbers]
    finally:
        close_shared_worker()
    return 0 if all(r["done"] for r in reports) else 1


def _stage_number(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number not in STAGES:
        raise ConfigError(f"--stage {text!r}: give one of {sorted(STAGES)} or 'all'")
    return number
