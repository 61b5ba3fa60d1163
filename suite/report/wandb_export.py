"""Records into W&B: `python -m suite wandb`, and a sweep's own runs at its end, through the one function here.

Each chosen record becomes its run (suite/report/wandb_runs.py) under an id from its machine and cell key; a run
whose content is as it was last written in this mode is left (the manifest beside the runs, tracking.MANIFEST), so
a second export writes nothing and never a second run. Each experiment with records gets its report's definition
(suite/report/wandb_reports.py), written beside the runs; online, the report is created or updated as well."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from suite.config import paths
from suite.core.experiment import Experiment
from suite.records import tracking
from suite.records.schema import Record
from suite.report import wandb_reports, wandb_runs


@dataclass
class Exported:
    """What an export did: the records chosen, the runs written (offline and online), those left as they were, those
    W&B did not take, the report definitions written and the reports published (their URLs)."""

    chosen: int = 0
    offline: int = 0
    online: int = 0
    unchanged: int = 0
    failed: list[str] = field(default_factory=list)  # a line for each run W&B did not take (its id and the error)
    definitions: list[Path] = field(default_factory=list)
    published: list[str] = field(default_factory=list)


def export(
    results_dir: Path,
    mode: str | None,
    experiments: Iterable[Experiment] | None = None,
    where: Callable[[Record], bool] | None = None,
    force: bool = False,
    reports: bool = True,
    progress=print,
    warn=print,
) -> Exported:
    """Write the chosen records' runs (every current record of `experiments`, definitions, or of all where none,
    that `where` accepts) in `mode` (tracking.resolve_mode: offline unless a key is configured), and their
    experiments' reports; `force` writes runs whose content is unchanged as well. Says what it did in a line or
    two."""
    done = Exported()
    mode = tracking.resolve_mode(mode)
    if mode == "off" or not tracking.installed():
        return done
    dir = tracking.folder(results_dir)
    runs = wandb_runs.payloads(results_dir, experiments, where, warn)
    done.chosen = len(runs)
    for run in runs:
        if not force and tracking.unchanged(dir, mode, run):
            done.unchanged += 1
            continue
        try:
            written = tracking.log_run(run, mode, dir)
        except Exception as exc:  # noqa: BLE001 — one run W&B refuses must not keep the others from it
            done.failed.append(f"{run.rid}: {type(exc).__name__}: {exc}"[:300])
            continue
        if written is not None and Path(written).name.startswith("offline-run-"):
            done.offline += 1
        elif written is not None:
            done.online += 1
    if reports:
        exps = wandb_runs.known(experiments)
        for name in sorted({run.group for run in runs} & set(exps)):
            defn = wandb_reports.definition(exps[name], results_dir, warn)
            if defn is None:
                continue
            done.definitions.append(wandb_reports.write(defn, dir))
            if mode == "online" and not tracking.unreachable():
                try:
                    done.published.append(wandb_reports.publish(defn, dir))
                except Exception as exc:  # noqa: BLE001 — the runs and the definition stand; say why, go on
                    progress(f"W&B: the report of {name} was not published ({type(exc).__name__}: {exc})")
    for line in said(done, results_dir):
        progress(line)
    return done


def said(done: Exported, results_dir: Path) -> list[str]:
    """The console's lines on an export: the runs it wrote, where, and how to upload offline ones."""
    lines = [
        f"W&B: {done.chosen} record(s): {done.offline + done.online} run(s) written, {done.unchanged} unchanged "
        "since the last export"
    ]
    if done.failed:
        lines.append(
            f"W&B: {len(done.failed)} run(s) not written (`{paths.DOCUMENTED_SUITE} wandb` tries again); the first: "
            f"{done.failed[0]}"
        )
    for mode, n in (("online", done.online), ("offline", done.offline)):
        if n and (line := tracking.said(mode, results_dir, n)):
            lines.append(line)
    if done.definitions:
        where = done.definitions[0].parent
        lines.append(f"W&B report definitions: {len(done.definitions)} under {where}")
    lines += [f"W&B report: {url}" for url in done.published]
    return lines
