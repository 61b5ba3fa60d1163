"""Tables rendered from records: results/<experiment>.md and .csv, the paper's values beside ours."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from suite.config.run import RunConfig
from suite.core.experiment import Cell
from suite.records.store import FINISHED


def _num(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else None


def _fmt(fmt: str, x: Any) -> str:
    v = _num(x)
    return "—" if v is None else fmt.format(v)


def table_rows(exp, cells, records: list[dict | None]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows: labels, status, then per metric ours / paper / ratio-to-baseline ours / paper."""
    base_idx = next((i for i, c in enumerate(cells) if c.row.name == exp.baseline), None)
    base_rec = records[base_idx] if base_idx is not None else None
    base_row = cells[base_idx].row if base_idx is not None else None
    cols = ["row", "method", *exp.label_columns, "status"]
    for m in exp.metrics:
        cols += [f"{m.label} ours", f"{m.label} paper"] if m.paper else [m.label]
        if m.ratio:
            cols += [f"{m.key} x{exp.baseline} ours", f"{m.key} x{exp.baseline} paper"]
    out = []
    for cell, rec in zip(cells, records):
        status = rec["status"] if rec else (f"skipped: {cell.row.skip}" if cell.row.skip else "not run")
        metrics = (rec or {}).get("metrics") or {}
        line: list[Any] = [
            cell.row.name,
            cell.row.method,
            *[cell.row.labels.get(c, "") for c in exp.label_columns],
            status,
        ]
        for m in exp.metrics:
            # An oom record has metrics only when they say why (a projection's memory past its cap).
            ours, paper = _num(metrics.get(m.key)) if status in FINISHED else None, cell.row.paper.get(m.key)
            line += [ours, paper] if m.paper else [ours]
            if m.ratio:
                b_ours = (
                    _num(((base_rec or {}).get("metrics") or {}).get(m.key))
                    if base_rec and base_rec.get("status") == "ok"
                    else None
                )
                b_paper = _num(base_row.paper.get(m.key)) if base_row else None
                line += [
                    ours / b_ours if ours is not None and b_ours else None,
                    _num(paper) / b_paper if _num(paper) is not None and b_paper else None,
                ]
        out.append(line)
    return cols, out


def render(exp, cells, records: list[dict | None], profile: str) -> tuple[str, str]:
    """Markdown and CSV text of an experiment's table, with provenance and notes."""
    cols, rows = table_rows(exp, cells, records)
    buf = io.StringIO()
    csv.writer(buf).writerows([cols, *[[("" if v is None else v) for v in r] for r in rows]])
    fmts = ["{}"] * (len(exp.label_columns) + 3)
    for m in exp.metrics:
        fmts += ([m.fmt, m.fmt] if m.paper else [m.fmt]) + (["{:.2f}x", "{:.2f}x"] if m.ratio else [])
    md = [
        f"# {exp.title}",
        "",
        f"Source: {exp.source}",
        "",
        f"## {profile}",
        "",
        "Generated from results/runs/ by `python -m suite run`; do not edit by hand.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        cells_txt = [
            (_fmt(f, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else ("—" if v is None else str(v)))
            for f, v in zip(fmts, r)
        ]
        md.append("| " + " | ".join(cells_txt) + " |")
    md += [""]
    if any(m.ratio for m in exp.metrics):
        md += [f"Ratios are to the `{exp.baseline}` row, ours and the paper's, each within one run.", ""]
    if exp.notes:
        md += [f"Notes: {exp.notes}", ""]
    md += ["Provenance:", ""]
    for cell, rec in zip(cells, records):
        if not rec:
            md.append(f"- `{cell.row.name}`: not run")
            continue
        p = rec.get("provenance") or {}
        desc = (
            f"- `{cell.row.name}` [{rec['status']}]: {p.get('device', '?')}, torch {p.get('torch', '?')}, "
            f"transformers {p.get('transformers', '?')}, commit {str(p.get('commit') or '?')[:10]}"
            f"{' (dirty)' if p.get('dirty') else ''}, cap {p.get('device_memory_cap_gb') or 'none'} GB, "
            f"memory: {(rec.get('metrics') or {}).get('memory_kind', '—')}, finished {rec.get('finished', '?')}, "
            f"run `{rec.get('key')}`"
        )
        if rec["status"] not in ("ok",) and rec.get("error"):
            lines = [x.strip() for x in rec["error"].strip().splitlines() if x.strip()]
            desc += f" — {lines[-1][:200]}"  # the exception's own line, not the traceback's first
        md.append(desc)
    return "\n".join(md) + "\n", buf.getvalue()


def sections(exp, results_dir: Path) -> list[tuple[str, list, list[dict | None]]]:
    """Every (profile, device, variant) this experiment has records for, each with its rows in table order."""
    groups: dict[tuple, dict[str, dict]] = {}
    for path in sorted((results_dir / "runs").glob("*.json")):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("experiment") != exp.name:
            continue
        key = (rec.get("profile"), rec.get("device_type"), rec.get("variant") or "")
        prev = groups.setdefault(key, {}).get(rec["row"])
        if prev is None or rec.get("finished", "") >= prev.get("finished", ""):
            groups[key][rec["row"]] = rec
    order = {"paper": 0, "small": 1, "tiny": 2}
    out = []
    for (profile, dev, variant), by_row in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1] or "", kv[0][2])
    ):
        rows = {r.name: r for r in exp.rows(profile)}
        cells, records = [], []
        for name, row in rows.items():
            rec = by_row.get(name)
            run = RunConfig.from_dict(rec["config"]["run"]) if rec else RunConfig(method=row.method)
            cells.append(Cell(exp.name, row, run, profile))
            records.append(rec)
        title = f"{profile} profile on {dev}" + (f", {variant}" if variant else "")
        out.append((title, cells, records))
    return out


def write_tables(exp, results_dir: Path) -> tuple[Path, Path]:
    """results/<experiment>.md and .csv, one section per profile, device and variant that has records."""
    parts, csv_rows = [], []
    for title, cells, records in sections(exp, results_dir):
        md, csv_text = render(exp, cells, records, title)
        parts.append(md.split("\n", 4)[4] if parts else md)  # the title and source only once
        lines = list(csv.reader(io.StringIO(csv_text)))
        if not csv_rows:
            csv_rows.append(["section", *lines[0]])
        csv_rows += [[title, *line] for line in lines[1:]]
    md_path, csv_path = results_dir / f"{exp.name}.md", results_dir / f"{exp.name}.csv"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text("\n".join(parts))
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows(csv_rows)
    return md_path, csv_path
