"""A campaign stage's report: what it ran, what it left, what the estimate said; the machine's environment; the
archive a lent machine's $OUT carries back."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from suite.measure.machine import describe
from suite.records.schema import Record


@dataclass
class StageReport:
    """What `stage-N.json` holds (the estimate reads its parts' `seconds` and `exit`)."""

    stage: int
    title: str
    dry: bool
    profile: str
    machine: str
    started: str
    budget_s: float
    suite_commit: str | None = None
    cells: list[dict] = field(default_factory=list)  # each record's experiment, row, key and status
    left: list[str] = field(default_factory=list)  # what the next call runs: parts, sweeps, cells
    estimate_s: float | None = None
    estimate: list[dict] | None = None  # the estimate's lines for this stage
    cuda_tests: dict | None = None  # each pytest step's counts, exit, seconds and tail (pytest_steps.run_pytest)
    bench: dict | None = None
    counted_vs_measured: dict | None = None
    seconds: float | None = None
    done: bool = False

    def finish(self, seconds: float) -> None:
        """Done when nothing is left and every pytest step passed (one not started is left, so not done)."""
        self.seconds = round(seconds, 1)
        steps = (self.cuda_tests, self.bench, self.counted_vs_measured)
        self.done = not self.left and all((s or {}).get("exit") in (0, None) for s in steps)

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, indent=1, default=str)


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


def summary_line(stage: int, exp: str, record: Record, row: str) -> str:
    m = record["metrics"]
    figures = ", ".join(
        f"{k} {m[k]:.4g}" for k in ("throughput", "memory_gb", "host_peak_gb") if isinstance(m.get(k), (int, float))
    )
    return f"stage {stage} | {exp}/{row} | {record['status']}" + (f" | {figures}" if figures else "")


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
