"""2BW paper Figure 8: throughput of 2BW configurations (d, b) against the global batch size."""

from __future__ import annotations

from experiments import pipedream_figs as pf
from suite.core.experiment import Metric

MEASURED = ((2, 2), (2, 8))  # (d, b) on 2 ranks
MEASURED_BATCHES = (16, 32, 64)
PEER_SCHEDULES = ("torch-1f1b", "torch-zero-bubble")
PROJECTED = ((8, 32), (8, 16), (4, 8))  # (d, b) on 64 V100s, w = 64 / d
PROJECTED_BATCHES = (512, 1024, 2048, 4096)


def _paper(d: int, b: int, batch: int) -> dict | None:
    if (d, b) == (8, 32):
        return {"throughput": "above (8, smaller b); rises with batch"}
    return {"throughput": "rises with batch"} if d == 4 else None


def rows(profile: str):
    out = [
        pf.measured(f"measured-d{d}-b{b}-B{batch}", "pipedream-2bw", d, 1, b, batch // b, False, config=f"({d},{b})")
        for d, b in MEASURED
        for batch in MEASURED_BATCHES
    ]
    # Peers: torch's 1F1B and zero-bubble schedules at the same (d, b), one pipeline (2BW's replicas are w=1 here).
    out += [
        pf.peer_measured(
            f"measured-{p}-d{d}-b{b}-B{batch}", p, d, b, batch // b, False, config=f"{pf.SYSTEM[p]} ({d},{b})"
        )
        for p in PEER_SCHEDULES
        for d, b in MEASURED
        for batch in MEASURED_BATCHES
    ]
    for d, b in PROJECTED:
        w = 64 // d
        for batch in PROJECTED_BATCHES:
            row = pf.projected(
                f"projected-d{d}-b{b}-B{batch}",
                "pipedream-2bw",
                "1.3B",
                d,
                w,
                batch,
                True,
                b=b,
                paper=_paper(d, b, batch),
                config=f"({d},{b})",
            )
            if batch // (b * w) < d:
                row.skip = f"m = {batch // (b * w)} < d = {d}: 2BW needs d micro-batches in flight per replica"
            out.append(row)
    return out


def draw(exp, sections, fig, axes) -> None:
    """Throughput against the global batch, a line per (d, b); measured and projected side by side."""
    _, cells, records = sections[0]
    for ax, src in zip(axes, ("measured", "projected")):
        for cfg in dict.fromkeys(c.row.labels["config"] for c in cells if c.row.labels["source"] == src):
            pts = [
                (c.row.labels["batch"], r["metrics"]["throughput"])
                for c, r in zip(cells, records)
                if c.row.labels["source"] == src and c.row.labels["config"] == cfg and r and r["status"] == "ok"
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"(d, b) = {cfg}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch size")
        ax.set_ylabel("samples/s")
        ax.set_title(
            f"{src}" + (": tiny BERT, 2 CPU ranks" if src == "measured" else ": GPT-1.3B, 64 V100s"), fontsize=9
        )
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(exp.title + "\npaper: throughput rises with batch; at d=8, b=32 beats the smaller b", fontsize=9)


EXPERIMENT = pf.FigureExperiment(
    name="2bw-fig8",
    title="2BW paper Figure 8: throughput of PipeDream-2BW (d, b) configurations against global batch size",
    source="PipeDream-2BW paper (pipedream-2bw.txt) §5.4, Figure 8: GPT 1.3B on 64 V100-16GB, seq 512",
    metrics=[
        Metric("throughput", "samples/s", "{:.3g}", ratio=False),
        Metric("memory_worst_rank_gb", "memory (worst rank/stage)", unit="GB", ratio=False, paper=False),
    ],
    label_columns=[*pf.LABELS, "config"],
    baseline="measured-d2-b2-B16",
    rows=rows,
    base=pf.base,
    figure=pf.panel_figure(2, (11, 4), draw),
    notes=(
        pf.ASSUMPTIONS + "Projected rows: 2BW with recomputation, w = 64 / d; a (d, b) needs batch >= d b w "
        "(m >= d), so (8, 32) starts at 2048. Paper (§5.4): throughput rises with the batch (less all-reduce "
        "per sample), most where replicas talk across servers; at d=8 the larger micro-batch (b=32) is faster, "
        "and smaller depths cannot fit it. Measured rows: 2BW on d=2 ranks without recomputation, b=2 and b=8, "
        "beside torch's 1F1B and zero-bubble schedules (peers, with a flush every step) at the same (d, b)."
    ),
)
