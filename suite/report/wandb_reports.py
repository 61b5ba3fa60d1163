"""A W&B report per experiment's table, from its definition and its records (issue 64, item 3).

The report shows the table's comparison as its page does: one panel grid per section (one machine's profile, device
and variant: the runs whose config `section` is its title), with the section's compact table as the page prints it,
a bar chart of each ratio to the reference row, ours beside the paper's, and one of each figure. A report's
definition is plain data (`definition`), written to a file offline; online, `publish` builds it with
wandb-workspaces' report API and creates the report, or updates the one an earlier export created (its URL kept
beside the definition)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from suite.config.files import write_atomic
from suite.core.experiment import Experiment
from suite.records import tracking
from suite.report import tables

TITLE_MAX = 128  # W&B's longest report title


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def definition(exp: Experiment, results_dir: Path, warn=print) -> dict[str, Any] | None:
    """The report of `exp`'s table as plain data, or None where no machine has records of it."""
    secs = tables.sections(exp, results_dir, warn)
    if not secs:
        return None
    out: dict[str, Any] = {
        "title": f"{exp.name}: {exp.title}"[:TITLE_MAX],
        "project": tracking.PROJECT,
        "experiment": exp.name,
        "description": f"{exp.source}. Generated from results/runs/ by `python -m suite wandb`; one panel grid per "
        "section of the table, ratios to the reference row within one machine's sweep.",
        "sections": [],
    }
    for title, cells, records in secs:
        cols = tables.columns(exp, tables.has_flops(records), tables.has_busy(records),
                              tables.units(exp, cells, records))  # fmt: skip
        _, rows = tables.table_rows(exp, cells, records)
        panels = []
        for m in exp.metrics:
            if m.ratio:
                panels.append(
                    {
                        "title": f"{tables.words(m.label)}: ratio to {exp.baseline}, ours and the paper's",
                        "metrics": [f"ratio/{m.key}"] + ([f"ratio_paper/{m.key}"] if m.paper else []),
                    }
                )
            named = m.label + (f" ({m.unit})" if m.unit else "")
            panels.append(
                {
                    "title": named + (", ours and the paper's" if m.paper else ""),
                    "metrics": [m.key] + ([f"paper/{m.key}"] if m.paper else []),
                }
            )
        brief = tables.briefs(exp, cells, records)
        out["sections"].append(
            {
                "title": title,
                "filters": f"Config('experiment') == {_quoted(exp.name)} and Config('section') == {_quoted(title)}",
                "table": "\n".join(tables.section_head(exp, cells, records, cols, rows)).strip(),
                "rows": [
                    {
                        "row": c.row.name,
                        "method": c.run.method,
                        "run": tracking.run_id(r) if r else None,
                        "status": b,
                    }
                    for c, r, b in zip(cells, records, brief)
                ],
                "panels": panels,
            }
        )
    return out


def path_of(dir: str | Path, experiment: str) -> Path:
    """Where an export writes the definition of `experiment`'s report: `reports/` beside the runs."""
    return Path(dir) / "reports" / f"{experiment}.json"


def write(defn: dict[str, Any], dir: str | Path) -> Path:
    path = path_of(dir, defn["experiment"])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(defn, indent=1) + "\n")
    return path


def build(defn: dict[str, Any], entity: str):
    """The wandb-workspaces Report of a definition (nothing sent: `publish` saves it)."""
    import wandb_workspaces.reports.v2 as wr

    blocks: list = [wr.P(defn["description"])]
    for sec in defn["sections"]:
        runset = wr.Runset(entity=entity, project=defn["project"], name=sec["title"][:100], filters=sec["filters"])
        panels = [wr.BarPlot(title=p["title"], metrics=p["metrics"], orientation="h") for p in sec["panels"]]
        blocks += [wr.H2(sec["title"]), wr.MarkdownBlock(sec["table"]), wr.PanelGrid(runsets=[runset], panels=panels)]
    return wr.Report(project=defn["project"], entity=entity, title=defn["title"], description=defn["title"],
                     blocks=blocks)  # fmt: skip


def publish(defn: dict[str, Any], dir: str | Path) -> str:
    """Create the report online, or update the one an earlier export created (its URL beside the definition); a
    definition unchanged since it was last published is not sent again; returns the report's URL."""
    import wandb
    import wandb_workspaces.reports.v2 as wr

    keep = path_of(dir, defn["experiment"]).with_suffix(".url")
    digest = hashlib.sha256(json.dumps(defn, sort_keys=True).encode()).hexdigest()[:20]
    said = keep.read_text().split() if keep.exists() else []
    if len(said) == 2 and said[1] == digest:
        return said[0]
    report = build(defn, wandb.Api().default_entity)
    try:
        earlier = wr.Report.from_url(said[0]) if said else None
    except Exception:  # noqa: BLE001 — a report deleted since, or not readable: a new one is made
        earlier = None
    if earlier is not None:
        earlier.title, earlier.description, earlier.blocks = report.title, report.description, report.blocks
        report = earlier
    report.save()
    write_atomic(keep, f"{report.url} {digest}\n")
    return report.url
