"""One-time conversion of the benchmarks' legacy results into records of the store, every measured value unchanged.

Before #28 each benchmark wrote a JSON file of its own (the four in LEGACY, under results/). This reads each, checks
that the benchmark's experiment today describes what was measured (shape, rounds, steps, sizes), and writes one
record per cell under results/runs/<machine>/, with the file's own provenance, machine and commit, and a
`converted_from` field naming the file. It ran once (`python -m experiments.benchmarks.legacy`), after which the files
were removed; git history keeps them, and running it again on a checkout that has them writes the same records.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from experiments.benchmarks import host_optim, l2l_host_step, overhead, pipeline_vs_torch
from suite.config.paths import RESULTS_DIR, ROOT
from suite.core.experiment import get_experiment
from suite.records import store
from suite.records.schema import machine_of


@dataclasses.dataclass
class Converted:
    """One cell's figures read from a legacy file: the experiment, profile and row they belong to."""

    experiment: str
    profile: str
    row: str
    metrics: dict


def last_commit(path: Path) -> tuple[str | None, str | None]:
    """The commit that last wrote `path` and its date (None, None for a file git does not hold); the commit that
    removed it after its conversion does not count."""
    proc = subprocess.run(
        ["git", "log", "-1", "--diff-filter=AM", "--format=%H %aI", "--", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return tuple(proc.stdout.split()) if proc.returncode == 0 and proc.stdout.strip() else (None, None)


def _cell(c: Converted):
    (cell,) = get_experiment(c.experiment).cells(c.profile, only=[c.row], overrides=["device=cpu"])
    return cell


def overhead_cells(legacy: dict) -> list[Converted]:
    profile = legacy["profile"]
    assert legacy["config"] == overhead.config_text(profile).split(), legacy["config"]
    metrics = {
        "layered_step_s": legacy["layered_step_s"],
        "plain_step_s": legacy["plain_step_s"],
        "layered_over_plain": legacy["ratio"],
        "repeats": legacy["repeats"],
    }
    c = Converted("bench-overhead", profile, "layered-vs-plain", metrics)
    assert _cell(c).run.steps == legacy["repeats"]
    return [c]


def host_optim_cells(legacy: dict) -> list[Converted]:
    out = []
    for run in legacy["runs"]:
        threads = "1" if run["threads"] == 1 else "all"
        assert threads == "1" or run["threads"] == legacy["machine"]["cpu"]["torch_threads"], run["threads"]
        m = {"threads": run["threads"], "numel": run["numel"], "times": run["raw"], "fixed": run["fixed_raw"]}
        metrics = host_optim.cell_metrics(run["rows"], m, run["size"], legacy["deepspeed"], legacy["fused_lamb"])
        c = Converted(
            "bench-host-optim", legacy["provenance"]["profile"], host_optim.row_name(run["size"], threads), metrics
        )
        cell = _cell(c)
        layers = host_optim.model_layers(cell.run.model)
        shapes = layers[1:2] if run["size"] == "layer" else layers
        assert run["numel"] == sum(s.numel() for named in shapes for _, s in named)
        assert run["rows"][0]["samples"] == cell.run.options["rounds"] * cell.run.steps
        assert {r["name"] for r in run["rows"]} >= set(host_optim.HEADLINE)
        out.append(c)
    return out


def l2l_host_step_cells(legacy: dict) -> list[Converted]:
    metrics = l2l_host_step.cell_metrics(
        legacy["summary"], legacy["raw"], legacy["shape"], legacy["rounds"], legacy["steps"]
    )
    c = Converted("bench-l2l-host-step", legacy["provenance"]["profile"], "host-update-variants", metrics)
    run = _cell(c).run
    assert legacy["shape"] == l2l_host_step.shape_text(run, "cpu"), legacy["shape"]
    assert (legacy["rounds"], legacy["steps"]) == (run.options["rounds"], run.steps)
    return [c]


# What the pipeline benchmark records of its setup, by the legacy file's own names.
PIPELINE_SETUP = (
    "ideal_speedup",
    "ranks",
    "threads_per_rank",
    "load_average_1min_at_end",
    "cpu_count",
    "micro_batches",
    "rounds",
    "steps_per_round",
)


def pipeline_cells(legacy: dict) -> list[Converted]:
    results = [{"run": name, **r} for name, r in legacy["results"].items()]
    metrics = pipeline_vs_torch.cell_metrics(results, {k: legacy[k] for k in PIPELINE_SETUP})
    c = Converted("bench-pipeline", legacy["provenance"]["profile"], "pipelines", metrics)
    run = _cell(c).run
    # The same model, batch and seed as the cell would run; `steps` there was the step count no one read.
    same = dataclasses.replace(run, method="grad_accum", options={}, steps=legacy["config"]["steps"])
    assert same.to_dict() == legacy["config"], (same.to_dict(), legacy["config"])
    assert (legacy["rounds"], legacy["steps_per_round"]) == (run.options["rounds"], run.steps)
    assert [r["run"] for r in results[1:]] == run.options["pipelines"].split(",")
    assert legacy["ranks"] == run.options["stages"]
    return [c]


# Each legacy file (under results/) and what reads it.
LEGACY = {
    "overhead/*.json": overhead_cells,
    "host_optim/*.json": host_optim_cells,
    "l2l_host_step/*.json": l2l_host_step_cells,
    "pipeline_bench.json": pipeline_cells,
}


def record(c: Converted, legacy: dict, source: Path, name: str) -> dict:
    """The record the runner would have written for the cell, with the legacy file's provenance and machine (none
    when it predates fingerprints) and its date, or, where it has none, that of the commit that last wrote it;
    `name`: the file's, as the record names it. What the file never said (its duration, a sweep) stays absent."""
    cell = _cell(c)
    assert legacy["provenance"]["device"].startswith("cpu") and legacy["provenance"]["methodology"] == "1"
    commit, finished = last_commit(source)
    if "date" in legacy:
        finished = datetime.strptime(legacy["date"], "%Y-%m-%d %H:%M UTC").replace(tzinfo=timezone.utc).isoformat()
    if finished is None:
        raise ValueError(f"{name}: neither the file nor git's history says when it was measured")
    rec = {
        "status": "ok",
        "metrics": c.metrics,
        "error": None,
        "provenance": legacy["provenance"],
        "rounds": 1,
        "key": cell.key,
        "experiment": c.experiment,
        "row": c.row,
        "method": cell.row.method,
        "profile": c.profile,
        "device_type": cell.run.device,
        "variant": "",
        "config": cell.resolved(),
        "finished": finished,
        "converted_from": {
            "file": name,
            "commit": commit,
            "by": "experiments/benchmarks/legacy.py",
            "finished": "the file's date" if "date" in legacy else "the date of that commit (the file has none)",
        },
    }
    if legacy.get("machine"):
        rec["machine"] = legacy["machine"]
    return rec


def convert(results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Write the records of every legacy file found under `results_dir`; returns the records' paths."""
    results_dir, written = Path(results_dir), []
    for pattern, cells_of in LEGACY.items():
        for source in sorted(Path(results_dir).glob(pattern)):
            legacy = json.loads(source.read_text())
            for c in cells_of(legacy):
                rec = record(c, legacy, source, f"results/{source.relative_to(results_dir)}")
                written.append(store.save(results_dir, rec["key"], machine_of(rec), rec))
    return written


if __name__ == "__main__":
    paths = convert()
    print("\n".join(str(p) for p in paths) or "no legacy benchmark results here", file=sys.stderr)
