"""Figures drawn with matplotlib from the same records as the tables."""

from __future__ import annotations

import re
from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the headless Agg backend (a figure never opens a window)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, results_dir, name: str, dpi: int = 120) -> Path:
    """Lay `fig` out, write it as results_dir/figures/<name>.png at `dpi` and close it; returns the path."""
    fig.tight_layout()
    out = Path(results_dir) / "figures" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    pyplot().close(fig)
    return out


def slug(title: str) -> str:
    """A section's title as part of a file name: lower case, every other run of characters one underscore."""
    return re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")


def ratio_bars(exp, results_dir: Path) -> list[Path]:
    """Per metric, each row's ratio to the baseline row: ours (one bar per profile/device) beside the paper's."""
    from suite.report import tables

    plt = pyplot()

    secs = tables.sections(exp, results_dir)
    if not secs:
        return []
    metrics = [m for m in exp.metrics if m.ratio]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        names = [c.row.name for c in secs[0][1]]
        series = []
        for title, cells, records in secs:
            cols, rows = tables.table_rows(exp, cells, records)
            idx = cols.index(f"{metric.key} x{exp.baseline} ours")
            series.append((f"ours: {title}", [r[idx] for r in rows]))
        cols, rows = tables.table_rows(exp, secs[0][1], secs[0][2])
        series.append(("paper", [r[cols.index(f"{metric.key} x{exp.baseline} paper")] for r in rows]))
        width = 0.8 / len(series)
        for k, (label, values) in enumerate(series):
            xs = [i + k * width for i in range(len(names))]
            ax.bar(xs, [v if v is not None else 0 for v in values], width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=20)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel(f"{metric.label} / {exp.baseline}")
        ax.legend(fontsize=7)
    fig.suptitle(exp.title, fontsize=10, wrap=True)
    return [save(fig, results_dir, exp.name)]
