"""L2L paper Table 4: L2L-CMP on one rank against N ranks (data parallel), 1, 2 and 4 micro-batches each."""

from __future__ import annotations

import dataclasses

import torch

from experiments.l2l_common import bert_base, half, l2l_row, skipped
from experiments.table3 import L2L_OPTIONS, UBATCHES
from suite.core.cell import throughput_cell
from suite.core.experiment import Experiment, Metric, Row
from suite.report.plots import ratio_figures

PAPER = {1: {1: 14.57, 2: 18.6, 4: 22.07}, 4: {1: 52.48, 2: 70.97, 4: 84.91}}  # #GPUs: #uBatches: samples/s
PAPER_N = 4
_UBATCH = {"paper": 64, "small": 32, "tiny": 16}  # micro-batch per rank


def all_ranks_throughput(run, device, cap) -> dict:
    """The throughput cell with samples/s over all ranks: each rank times the same lockstep step
    (layers all-reduce as they finish) but counts only its own shard of the global minibatch."""
    m = throughput_cell(run, device, cap)
    median = m["step_time_median"]
    return {**m, "throughput": run.batch_size / median, "throughput_per_rank": run.batch_size / run.ranks / median}


def ranks_n(profile: str) -> tuple[int, str | None]:
    """N and why its rows cannot run here: 2 CPU ranks (gloo) at `tiny`, else every GPU of this machine (NCCL)."""
    if profile == "tiny":
        return 2, None
    n = torch.cuda.device_count()
    # Without them the row keeps the paper's N: a count (fake process group) takes it, a measurement skips it.
    return (n, None) if n >= 2 else (PAPER_N, f"needs 2 or more GPUs for NCCL ranks; this machine has {n}")


def base(profile: str) -> dict:
    # gloo ranks on CPU at `tiny`: on a GPU machine `auto` would put both ranks on one GPU, which NCCL refuses.
    return bert_base(profile, precision=half(profile), **({"device": "cpu"} if profile == "tiny" else {}))


def rows(profile: str) -> list[Row]:
    ub = _UBATCH[profile]
    n, reason = ranks_n(profile)
    out = []
    for ranks, name, paper_gpus, skip in ((1, "1-rank", 1, None), (n, "N-ranks", PAPER_N, reason)):
        for u in UBATCHES:
            # micro_batch_size is global: each rank takes ub samples of every micro-batch.
            overrides = {"ranks": max(ranks, 1), "micro_batch_size": ub * max(ranks, 1), "num_micro_batches": u}
            labels = skipped(
                {"#ranks": ranks, "paper #GPUs": paper_gpus, "uBatch/rank": ub, "#uBatches": u, "device batch": ub * u},
                skip,
            )
            out.append(
                l2l_row(
                    f"{name}-u{u}",
                    "l2l-cmp",
                    overrides,
                    labels,
                    {"throughput": PAPER[paper_gpus][u]},
                    options=L2L_OPTIONS,
                    skip=skip,
                    count_anyway=True,  # GPUs are what it lacks, and a count needs none
                )
            )
            if ranks == 1:  # Table 3's L2L-CMP cell with u micro-batches is this very config: its record serves
                out[-1] = dataclasses.replace(out[-1], same_as=("table3", f"l2l-cmp-u{u}"), adapt=one_rank)
    return out


def one_rank(metrics: dict) -> dict:
    """Table 3's throughput cell read as this table's kind reads one rank: all its samples are the rank's."""
    return {**metrics, "throughput_per_rank": metrics["throughput"]} if "throughput" in metrics else metrics


EXPERIMENT = Experiment(
    name="table4",
    title="Table 4: L2L-CMP throughput, one rank vs N ranks, by #micro-batches",
    source="L2L paper (l2l-constant-memory.txt), section 3.3, Table 4: BERT-Large, CMP, 1 and 4 V100-16GB "
    "(PyTorch DDP, no NVLink)",
    metrics=[
        Metric("throughput", "throughput (samples/s)"),
        Metric("throughput_per_rank", "per rank (samples/s)", ratio=False),
        Metric("memory_gb", "memory/rank", unit="GB", ratio=False),
    ],
    label_columns=["#ranks", "paper #GPUs", "uBatch/rank", "#uBatches", "device batch", "note"],
    baseline="1-rank-u1",
    rows=rows,
    base=base,
    kind="all-ranks-throughput",
    figure=ratio_figures,
    notes=(
        "Throughput is over all ranks: the global minibatch (ranks x uBatch x #uBatches) over the median step "
        "time of rank 0, whose steps run in lockstep with the others'. Ratios to `1-rank-u1` show scaling and the "
        "inner loop together (the paper: 3.6x from 1 to 4 GPUs at one micro-batch). At `paper` N is every GPU "
        "of the machine that runs the sweep (the paper's is 4; with another N compare per-rank throughput); a "
        "machine with one GPU leaves the N-rank rows not run, with the reason in their note. At `tiny` N is 2 "
        "gloo ranks on CPU, launched with torchrun, sharing the machine's CPU cores with each other: they "
        "exercise the per-layer gradient all-reduce, not scaling. L2L rows "
        "keep the stash on the host and overlap host updates (stash=cpu, overlap=on), as in Table 3."
    ),
)
