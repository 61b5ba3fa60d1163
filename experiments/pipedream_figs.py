"""Shared parts of the 2BW paper's Figures 6-9: measured and projected rows, and their figures."""

from __future__ import annotations

from pathlib import Path

from suite.core.experiment import ProjectedRow, Row
from suite.core.experiment import ProjectingExperiment as FigureExperiment  # noqa: F401 — the figures' experiment
from suite.records.schema import metrics_of
from suite.report import plots

# The paper's GPT models as (blocks, hidden, heads): our assumption, chosen to match the parameter counts
# with untied input and output embeddings (vocab 51200, sequence 512): 1.42B (GPT-3 XL's shape, 1.3B with
# tied embeddings), 2.22B and 3.80B.
GPT = {"1.3B": (24, 2048, 16), "2.2B": (40, 2048, 16), "3.8B": (45, 2560, 20)}
SEQ, VOCAB = 512, 51200
SYSTEM = {
    "gpipe": "GPipe",
    "pipedream-flush": "PipeDream-Flush",
    "pipedream-2bw": "PipeDream-2BW",
    "mp": "inter-layer MP",
    # Peers: torch.distributed.pipelining's schedules driving the same layers (methods/peers/torch_pipelining.py).
    "torch-gpipe": "torch GPipe (peer)",
    "torch-1f1b": "torch 1F1B (peer)",
    "torch-interleaved-1f1b": "torch interleaved 1F1B (peer)",
    "torch-zero-bubble": "torch zero bubble (peer)",
}
# The peers' schedules in the measured rows of Figures 6 and 8.
PEERS = ("torch-gpipe", "torch-1f1b", "torch-interleaved-1f1b", "torch-zero-bubble")
LABELS = ["source", "system", "model", "d", "w", "b", "m", "batch", "recompute"]
# The measured rows' model per profile (as planner-check): tiny BERT on CPU, bigger on GPUs.
MODEL = {
    "tiny": {"model.preset": "tiny", "seq_len": 64},
    "small": {"model.preset": "tiny-wide", "seq_len": 128},
    "paper": {"model.preset": "bert-base", "seq_len": 512},
}
ASSUMPTIONS = (
    "Projected rows are the planner's cost model (methods/pipeline/planner/costmodel.py, analytic GPT profile, "
    "mixed precision: 2-byte weight versions, 16 B/param of FP32 master, gradient and Adam state) "
    "on the V100-16GB p3.16xlarge spec (45 TFLOP/s achieved, NVLink 150 GB/s inside a server, "
    "25 Gbit/s between servers: AWS's figures, not the paper's), links placed server by server "
    "(p2p crosses servers when d > 8, the all-reduce when d x w > 8). GPT dims are our assumption "
    "matching the parameter counts: 1.3B = 24 x 2048 (16 heads; 1.42B with an untied output "
    "embedding), 2.2B = 40 x 2048 (16 heads), 3.8B = 45 x 2560 (20 heads); sequence 512, vocab 51200. "
    "Measured rows are real multi-process runs (gloo, torchrun) of a tiny BERT on this host's CPU: "
    "they show shapes, not the paper's absolute numbers; memory there is the CPU live-bytes "
    "tracker's worst rank. "
)


def base(profile: str) -> dict:
    return {"optimizer": "lamb", "lr": 1e-4, "warmup": 2, "steps": 6, **MODEL[profile]}


def measured(
    name: str,
    method: str,
    d: int,
    w: int,
    b: int,
    m: int,
    recompute: bool,
    paper=None,
    extra: dict | None = None,
    **labels,
) -> Row:
    """A real run with executor=dist on d x w ranks; m micro-batches per replica."""
    return Row(
        name,
        method,
        {
            "executor": "dist",
            "stages": d,
            "width": w,
            "recompute": recompute,
            "micro_batch_size": b,
            "num_micro_batches": m * w,
            **(extra or {}),
        },
        {
            "source": "measured",
            "system": SYSTEM[method],
            "model": "tiny BERT",
            "d": d,
            "w": w,
            "b": b,
            "m": m,
            "batch": b * m * w,
            "recompute": "on" if recompute else "off",
            **labels,
        },
        paper or {},
    )


def peer_measured(name: str, method: str, d: int, b: int, m: int, recompute: bool, **labels) -> Row:
    """A peer's real run on d ranks (torch's schedule over our layers), labelled as `measured` does."""
    return Row(
        name,
        method,
        {"stages": d, "recompute": recompute, "micro_batch_size": b, "num_micro_batches": m},
        {
            "source": "measured",
            "system": SYSTEM[method],
            "model": "tiny BERT",
            "d": d,
            "w": 1,
            "b": b,
            "m": m,
            "batch": b * m,
            "recompute": "on" if recompute else "off",
            **labels,
        },
    )


def gpt_overrides(model: str, layers: int | None = None) -> dict:
    n, h, a = GPT[model]
    return {
        "model.family": "gpt2",
        "model.layers": layers or n,
        "model.hidden": h,
        "model.heads": a,
        "model.intermediate": 4 * h,
        "model.max_seq": SEQ,
        "model.vocab_size": VOCAB,
        "seq_len": SEQ,
    }


def projected(
    name: str,
    system: str,
    model: str,
    d: int,
    w: int,
    batch: int,
    recompute: bool = True,
    b: int | None = None,
    paper=None,
    projection: dict | None = None,
    **labels,
) -> ProjectedRow:
    """A planner prediction for GPT `model` on d x w V100s at global `batch`; b=None lets the planner pick
    the fastest fitting micro-batch size. `system` is a planner schedule name; "mp" rows are carried by the
    gpipe method's options (inter-layer MP is GPipe's schedule with one micro-batch in flight)."""
    method = "gpipe" if system == "mp" else system
    shape = (
        {"micro_batch_size": 1, "num_micro_batches": batch}
        if b is None
        else {"micro_batch_size": b, "num_micro_batches": batch // b}
    )
    proj = {"spec": "v100", "method": system, "micro_batch": "fastest" if b is None else "fixed", **(projection or {})}
    return ProjectedRow(
        name,
        method,
        {**gpt_overrides(model), "stages": d, "width": w, "recompute": recompute, **shape},
        {
            "source": "projected",
            "system": SYSTEM[system],
            "model": f"GPT-{model}",
            "d": d,
            "w": w,
            "b": "planner" if b is None else b,
            "m": "" if b is None else batch // (b * w),
            "batch": batch,
            "recompute": "on" if recompute else "off",
            **labels,
        },
        paper or {},
        projection=proj,
    )


# ---------------------------------------------------------------------------------------------------
# Figures: one panel per source (measured, projected), drawn from the same records as the table.


def latest_section(exp, results_dir: Path):
    """(cells, records) of the first section with records (the profile order of tables.sections)."""
    from suite.report import tables

    secs = tables.sections(exp, results_dir, variants=False)
    return (secs[0][1], secs[0][2]) if secs else ([], [])


def panel_figure(ncols: int, size: tuple[float, float], draw):
    """An experiment's figure: draw(exp, sections, fig, axes) on `ncols` panels in a row, given the sections with
    records as plots.figure_of_sections does, saved under the experiment's name."""

    def figure(exp, results_dir: Path) -> list[Path]:
        def panels(sections):
            fig, axes = plots.pyplot().subplots(1, ncols, figsize=size, squeeze=False)
            draw(exp, sections, fig, axes[0])
            return fig

        return plots.figure_of_sections(exp, results_dir, exp.name, panels)

    return figure


def grouped_bars(
    exp,
    results_dir: Path,
    key: str,
    ylabel: str,
    groups=("model", "batch"),
    relative_to=None,
    cap_gb: dict | None = None,
    paper: str = "",
) -> list[Path]:
    """Bars of `key` per system, grouped by `groups` labels, one panel per source; OOM bars marked; each bar
    annotated with its ratio to the group's `relative_to` system; the paper's claims under the title."""
    cells, records = latest_section(exp, results_dir)
    sources = [s for s in ("measured", "projected") if any(c.row.labels.get("source") == s for c in cells)]
    if not sources:
        return []
    fig, axes = plots.pyplot().subplots(1, len(sources), figsize=(7 * len(sources), 4.2), squeeze=False)
    systems = list(SYSTEM.values())
    palette = ("tab:red", "tab:blue", "tab:green", "tab:gray", "tab:orange", "tab:purple", "tab:brown", "tab:pink")
    colors = dict(zip(systems, palette))
    for ax, src in zip(axes[0], sources):
        pts = [(c, r) for c, r in zip(cells, records) if c.row.labels.get("source") == src]
        names = list(dict.fromkeys(_group(c, groups) for c, _ in pts))
        present = [s for s in systems if any(c.row.labels["system"] == s for c, _ in pts)]
        width = 0.8 / max(len(present), 1)
        top = 0.0
        for c, r in pts:
            v = metrics_of(r).get(key)
            top = max(top, v or 0.0)
        for c, r in pts:
            g = names.index(_group(c, groups))
            k = present.index(c.row.labels["system"])
            status = r["status"] if r else "not run"
            v = metrics_of(r).get(key) if status in ("ok", "oom") else None
            x = g + k * width
            ax.bar(
                x,
                v or 0.0,
                width,
                color=colors[c.row.labels["system"]],
                hatch="//" if status == "oom" else None,
                edgecolor="black" if status == "oom" else None,
                label=c.row.labels["system"]
                if g == 0 or c.row.labels["system"] not in ax.get_legend_handles_labels()[1]
                else None,
            )
            note = "OOM" if status == "oom" else ("" if v is not None else status[:10])
            if v is not None and relative_to and status == "ok":
                ref = next(
                    metrics_of(rr).get(key)
                    for cc, rr in pts
                    if cc.row.labels["system"] == relative_to
                    and all(cc.row.labels.get(gg) == c.row.labels.get(gg) for gg in groups)
                )
                note = f"{v / ref:.2f}x" if ref else ""
            ax.text(x, (v or 0.0) + top * 0.01, note, ha="center", va="bottom", fontsize=6, rotation=90)
        if cap_gb and src in cap_gb:
            ax.axhline(cap_gb[src], color="black", ls="--", lw=0.8, label=f"{cap_gb[src]:g} GB cap")
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(names))], names, fontsize=7, rotation=15)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{src}" + (f" (bar labels: x {relative_to})" if relative_to else ""), fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(exp.title + (f"\npaper: {paper}" if paper else ""), fontsize=9, wrap=True)
    return [plots.save(fig, results_dir, exp.name)]


def _group(cell, groups) -> str:
    return ", ".join(f"{g} {cell.row.labels.get(g)}" if g != "model" else str(cell.row.labels.get(g)) for g in groups)
