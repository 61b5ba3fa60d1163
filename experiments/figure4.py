"""L2L paper Figure 4: dev-score curves while fine-tuning each GLUE task, baseline against L2L, FP32 and 16-bit,
drawn from each run's history (the rows its W&B run logged), with the training loss beneath."""

from __future__ import annotations

from pathlib import Path

from suite.records.schema import metrics_of
from suite.report import plots
from suite.tasks import metrics
from suite.tasks.finetune import timeline

# Panel rows: which table rows share a panel, and how each is drawn.
PANELS = (
    ("FP32", (("baseline-fp32", "AG (FP32)", "C0", "-"), ("l2l-fp32", "L2L (FP32)", "C3", "--"))),
    ("16-bit", (("baseline-amp", "AG + AMP", "C0", "-"), ("l2l-cmp", "L2L-CMP", "C3", "--"))),
)


def _histories(cells, records) -> dict[str, dict[str, list[dict]]]:
    """task -> row variant -> history rows (step, epoch, train/<key>, dev/<metric>), for the rows that finished.
    Records made before histories existed give their evaluation curve as dev rows."""
    out: dict[str, dict[str, list[dict]]] = {}
    for cell, rec in zip(cells, records):
        m = metrics_of(rec) if rec and rec["status"] == "ok" else {}
        rows = m.get("history") or timeline([], m.get("curve") or [])
        if rows:
            task = cell.row.task
            out.setdefault(task, {})[cell.row.name[len(task) + 1 :]] = rows
    return out


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["epoch"], r[key]) for r in rows if r.get(key) is not None]
    return ([x for x, _ in pts], [y for _, y in pts])


def draw(exp, results_dir: Path) -> list[Path]:
    """One figure per profile/device section with curves: a column per task, FP32 above 16-bit."""
    return plots.figure_per_section(exp, results_dir, "figure4", _section_figure, dpi=110)


def _section_figure(title: str, cells, records):
    """One section's curves: a column per task, FP32 above 16-bit, the training loss beneath; None without any."""
    histories = _histories(cells, records)
    tasks = [t for t in dict.fromkeys(c.row.task for c in cells) if t in histories]
    if not tasks:
        return None
    n = len(PANELS) + 1  # a row of dev curves per precision, the training loss beneath
    fig, axes = plots.pyplot().subplots(n, len(tasks), figsize=(3.6 * len(tasks), 2.8 * n), squeeze=False, sharex="col")
    for col, task in enumerate(tasks):
        key = f"dev/{metrics.HEADLINE[task]}"
        for row, (precision, lines) in enumerate(PANELS):
            ax = axes[row][col]
            for variant, label, color, style in lines:
                rows = histories[task].get(variant)
                if rows:
                    ax.plot(*_series(rows, key), style, color=color, marker="o", ms=3, label=label)
                    loss = axes[-1][col]
                    loss.plot(*_series(rows, "train/loss"), style, color=color, lw=0.8, alpha=0.8, label=f"{label}")
            ax.set_title(f"{task.upper()} {precision}", fontsize=9)
            ax.set_ylabel(f"{key} (%)", fontsize=8)
            plots.grid_and_legend(ax, 7)
        loss = axes[-1][col]
        loss.set_title(f"{task.upper()} training loss", fontsize=9)
        loss.set_xlabel("epoch", fontsize=8)
        plots.grid_and_legend(loss, 6)
    fig.suptitle(f"Figure 4: validation curves, {title}", fontsize=10)
    return fig
