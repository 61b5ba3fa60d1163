"""`make decoder-8b` projects its rows too: each decoder-8b row that fits (AMP at full depth is counted past the
device) on an H100 and an H200 with their hosts, a roofline per row (methods/roofline.py): what the step computes,
moves over PCIe and streams through host memory, the limit named, held to that GPU's decoder-8b record of the row
once a loan has measured one."""

from __future__ import annotations

from experiments import decoder_8b
from methods.roofline import MACHINES, SLUGS
from suite.core.experiment import Metric, ProjectedRow, ProjectingExperiment, Row

NOT_PROJECTED = ("8b-amp", "7b-amp")  # past the device at full depth (counted oom): nothing to project


def rows(profile: str) -> list[Row]:
    return [
        ProjectedRow(
            f"{machine}-{row.name}",
            row.method,
            row.overrides,
            {"machine": machine, **row.labels},
            projection={
                "machine": machine,
                "reference": {"machine": SLUGS[machine], "experiment": "decoder-8b", "row": row.name},
            },
        )
        for machine in MACHINES
        for row in decoder_8b.rows("paper")
        if row.name not in NOT_PROJECTED
    ]


EXPERIMENT = ProjectingExperiment(
    name="decoder-8b-roofline",
    title="Llama 3 8B (and Llama 2 7B's shape) on one GPU, projected: each row's roofline on an H100 and an H200",
    source="methods/roofline.py; the rows of decoder-8b (issue 54)",
    metrics=[
        Metric("tokens_per_s", "tokens/s (projected)", "{:.0f}", ratio=False, paper=False),
        Metric("tflops_6n", "TFLOPS (6N)", "{:.0f}", ratio=False, paper=False),
        Metric("mfu", "MFU", "{:.0%}", ratio=False, paper=False),
        Metric("bound", "limit", "{}", ratio=False, paper=False),
        Metric("step_time", "step (s)", "{:.3g}", ratio=False, paper=False),
        Metric("pcie_gb", "PCIe a step (GB)", "{:.3g}", ratio=False, paper=False),
        Metric("compute_s", "compute (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("h2d_s", "uploads (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("d2h_s", "downloads (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("host_s", "host (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("tail_s", "in series (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("reference", "measured (tokens/s)", "{:.0f}", ratio=False, paper=False),
        Metric("error", "error", "{:+.1%}", ratio=False, paper=False),
    ],
    label_columns=["machine", "model", "method"],
    baseline="h100-8b-8l-amp",
    rows=rows,
    base=lambda profile: decoder_8b.base("paper"),
    rounds=1,
    projected_kind="roofline",
    notes=(
        "Projected, nothing measured: each row's step from what it computes (the step's hardware FLOPs, recompute "
        "included, at the GEMM rate), moves over PCIe each way and streams through host memory, each at the "
        "machine's rate; the busiest resource is the `limit`, and `in series` what cannot overlap it (L2L: the "
        "embeddings' and first block's updates after the backward and the first upload; FSDP2's offload: its host "
        "optimizer after the backward; AMP: its optimizer on the device). `measured` is that GPU's decoder-8b record "
        "of the row where a loan has made one, `error` the projection against it. Rates, per machine: "
        + " ".join(
            f"**{k}**: " + "; ".join(f"{part}: {why}" for part, why in m.sources.items()) + "."
            for k, m in MACHINES.items()
        )
    ),
)
