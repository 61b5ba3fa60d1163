"""2BW paper Figure 6: throughput of GPipe, PipeDream-Flush, 2BW (and inter-layer MP) at a low and a high batch."""

from __future__ import annotations

from experiments import pipedream_figs as pf
from suite.core.experiment import Metric

METHODS = ("gpipe", "pipedream-flush", "pipedream-2bw")
# The paper's claims (§5.2); it prints no absolute values for these bars in its text.
PAPER = {
    ("2.2B", 64, "pipedream-2bw"): "up to 1.6x Flush, up to 3.2x GPipe, up to 6.1x MP (low batch)",
    ("2.2B", 64, "pipedream-flush"): "2.1x GPipe (low batch)",
    ("2.2B", 64, "mp"): "Flush up to 4.1x MP (low batch)",
    ("2.2B", 512, "pipedream-flush"): "3x GPipe (high batch)",
    ("2.2B", 512, "mp"): "Flush up to 5.3x MP (high batch)",
    ("3.8B", 2048, "pipedream-2bw"): "1.15x Flush (batch 2048)",
}
# Projected: (model, d, w, batches), the paper's planner-chosen depths on 8 and 64 V100s.
PROJECTED = [("2.2B", 8, 1, (64, 512)), ("3.8B", 16, 4, (512, 2048))]


def rows(profile: str):
    out = [pf.measured(f"measured-{meth}-m{m}", meth, 2, 1, 4, m, True) for m in (2, 16) for meth in METHODS]
    # Peers: torch's schedules over the same layers, split and micro-batches, recomputing as ours do.
    out += [pf.peer_measured(f"measured-{p}-m{m}", p, 2, 4, m, True) for m in (2, 16) for p in pf.PEERS]
    for model, d, w, batches in PROJECTED:
        for batch in batches:
            for system in (*METHODS, "mp"):
                paper = PAPER.get((model, batch, system))
                out.append(
                    pf.projected(
                        f"projected-{model}-{system}-B{batch}",
                        system,
                        model,
                        d,
                        w,
                        batch,
                        paper={"throughput": paper} if paper else None,
                    )
                )
    return out


def figure(exp, results_dir):
    return pf.grouped_bars(
        exp,
        results_dir,
        "throughput",
        "samples/s",
        relative_to="GPipe",
        paper="2BW up to 1.6x Flush at low batch, 1.15x at 2048; 2BW up to 3.2x GPipe; "
        "Flush 2.1x / 3x GPipe at low / high batch; 2BW up to 6.1x inter-layer MP",
    )


EXPERIMENT = pf.FigureExperiment(
    name="2bw-fig6",
    title=(
        "2BW paper Figure 6: throughput of GPipe, PipeDream-Flush, PipeDream-2BW and inter-layer MP at two batch sizes"
    ),
    source="PipeDream-2BW paper (pipedream-2bw.txt) §5.2, Figure 6: GPT 2.2B on 8 and 3.8B on 64 V100-16GB, seq 512",
    metrics=[
        Metric("throughput", "samples/s", "{:.3g}", ratio=False),
        Metric("b", "micro-batch (planner's pick)", "{:.0f}", ratio=False, paper=False),
        Metric("memory_worst_rank_gb", "memory (worst rank/stage)", unit="GB", ratio=False, paper=False),
    ],
    label_columns=pf.LABELS,
    baseline="measured-gpipe-m2",
    rows=rows,
    base=pf.base,
    figure=figure,
    notes=(
        pf.ASSUMPTIONS + "All rows use activation recomputation, as the paper's Figure 6. Projected rows let "
        "the planner pick the fastest micro-batch size that fits 16 GB (the paper: the largest that fits) for "
        "each system at the global batch; inter-layer MP runs one micro-batch through the d stages at a time. "
        "Measured rows: d=2 ranks, micro-batches of 4, m=2 (batch 8) and m=16 (batch 64); the `(peer)` systems "
        "are torch.distributed.pipelining's schedules driving the same layers (interleaved ones: 2 stages per "
        "rank), measured in the same rounds. The paper's "
        "column holds its stated ratios (§5.2); the figure labels each bar with its ratio to GPipe."
    ),
)
