"""L2L paper Figure 4: dev-score curves while fine-tuning each GLUE task, baseline against L2L, FP32 and 16-bit."""

from __future__ import annotations

import re
from pathlib import Path

from suite.tasks import metrics

# Panel rows: which table rows share a panel, and how each is drawn.
PANELS = (
    ("FP32", (("baseline-fp32", "AG (FP32)", "C0", "-"), ("l2l-fp32", "L2L (FP32)", "C3", "--"))),
    ("16-bit", (("baseline-amp", "AG + AMP", "C0", "-"), ("l2l-cmp", "L2L-CMP", "C3", "--"))),
)


def _curves(cells, records) -> dict[str, dict[str, list[dict]]]:
    """task -> row variant -> curve, for the rows that finished."""
    out: dict[str, dict[str, list[dict]]] = {}
    for cell, rec in zip(cells, records):
        curve = ((rec or {}).get("metrics") or {}).get("curve") if rec and rec.get("status") == "ok" else None
        if curve:
            task = cell.row.task
            out.setdefault(task, {})[cell.row.name[len(task) + 1 :]] = curve
    return out


def draw(exp, results_dir: Path) -> list[Path]:
    """One figure per profile/device section with curves: a column per task, FP32 above 16-bit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from suite.report import tables

    paths = []
    for title, cells, records in tables.sections(exp, Path(results_dir)):
        curves = _curves(cells, records)
        tasks = [t for t in dict.fromkeys(c.row.task for c in cells) if t in curves]
        if not tasks:
            continue
        fig, axes = plt.subplots(len(PANELS), len(tasks), figsize=(3.6 * len(tasks), 5.6), squeeze=False, sharex="col")
        for col, task in enumerate(tasks):
            key = metrics.HEADLINE[task]
            for row, (precision, lines) in enumerate(PANELS):
                ax = axes[row][col]
                for variant, label, color, style in lines:
                    curve = curves[task].get(variant)
                    if curve:
                        ax.plot(
                            [p["epoch"] for p in curve],
                            [p[key] for p in curve],
                            style,
                            color=color,
                            marker="o",
                            ms=3,
                            label=label,
                        )
                ax.set_title(f"{task.upper()} {precision}", fontsize=9)
                ax.set_ylabel(f"dev {key} (%)", fontsize=8)
                ax.grid(alpha=0.3)
                if ax.get_lines():
                    ax.legend(fontsize=7)
                if row == len(PANELS) - 1:
                    ax.set_xlabel("epoch", fontsize=8)
        fig.suptitle(f"Figure 4: validation curves, {title}", fontsize=10)
        fig.tight_layout()
        slug = re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")
        out = Path(results_dir) / "figures" / f"figure4_{slug}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        plt.close(fig)
        paths.append(out)
    return paths
