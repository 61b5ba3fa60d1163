"""Figures drawn with matplotlib from the same records as the tables."""

from __future__ import annotations

import re
from pathlib import Path

from suite.report import tables


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


def figure_of_sections(exp, results_dir, name: str, draw, dpi: int = 120) -> list[Path]:
    """One figure of every profile/device section with records (tables.sections: (title, cells, records) each):
    draw(sections) makes it (None: nothing to draw) and it is saved as <name>; nothing without records."""
    sections = tables.sections(exp, Path(results_dir))
    fig = draw(sections) if sections else None
    return [] if fig is None else [save(fig, results_dir, name, dpi)]


def figure_per_section(exp, results_dir, name: str, draw, dpi: int = 120) -> list[Path]:
    """A figure per profile/device section with records: draw(title, cells, records) makes it (None: nothing to
    draw) and it is saved as <name>_<the title's slug>."""
    paths = []
    for title, cells, records in tables.sections(exp, Path(results_dir)):
        fig = draw(title, cells, records)
        if fig is not None:
            paths.append(save(fig, results_dir, f"{name}_{slug(title)}", dpi))
    return paths


def grid_and_legend(ax, fontsize: float) -> None:
    """A light grid, and a legend where the axes hold a line."""
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=fontsize)


def ratio_bars(exp, results_dir: Path) -> list[Path]:
    """Per metric, each row's ratio to the baseline row: ours (one bar per profile/device) beside the paper's."""
    return figure_of_sections(exp, results_dir, exp.name, lambda secs: _ratio_bars(exp, secs))


def _ratio_bars(exp, secs):
    """The ratio bars of `secs` (tables.sections), a panel per metric."""
    metrics = [m for m in exp.metrics if m.ratio]
    fig, axes = pyplot().subplots(1, len(metrics), figsize=(6 * len(metrics), 4), squeeze=False)
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
    return fig
