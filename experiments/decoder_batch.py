"""`make decoder`'s third table: the largest micro-batch each one-GPU method fits for every Llama size, at sequence
4096 and 8192, on an 80 GB and on a 16 GB device with a 128 GiB host, found by counts on fake tensors."""

from __future__ import annotations

from experiments.decoder import DEVICES, HOSTS, SIZES
from experiments.decoder_largest import METHODS
from suite.core.experiment import Metric, ProjectedRow, ProjectingExperiment

SEQS = (4096, 8192)
HOST = "128 GiB"  # the lent H100's host


def rows(profile: str) -> list[ProjectedRow]:
    return [
        ProjectedRow(
            f"{size.removeprefix('llama-')}-{name}-s{seq}-{device}",
            method,
            {"model.preset": size, "seq_len": seq, "device_memory": DEVICES[device], **overrides},
            {"model": size, "seq": seq, "device": device, "method": label},
            projection={"host": HOSTS[HOST], "over": "micro_batch_size"},
        )
        for device in DEVICES
        for size in SIZES
        for seq in SEQS
        for name, method, overrides, label in METHODS
    ]


def base(profile: str) -> dict:
    return {"micro_batch_size": 1, "num_micro_batches": 1, "optimizer": "adamw", "lr": 1e-4}


EXPERIMENT = ProjectingExperiment(
    name="decoder-batch",
    title="Decoders: the largest micro-batch each method fits, Llama 1B to 70B at sequence 4096 and 8192 (counted)",
    source="counts on fake tensors (docs/counting.md), Llama 3.2 1B/3B and Llama 3 8B/70B shapes, a 128 GiB host",
    metrics=[
        Metric("max_micro_batch", "micro-batch", "{:.0f}", ratio=False, paper=False),
        Metric("tokens_per_micro_batch", "tokens", "{:.0f}", ratio=False, paper=False),
        Metric("memory_gb", "device peak", unit="GB", ratio=False, paper=False),
        Metric("host_peak_gb", "host peak (GB)", "{:.0f}", ratio=False, paper=False),
    ],
    label_columns=["model", "seq", "device", "method"],
    baseline="1b-ag-fp32-s4096-80GB",
    rows=rows,
    base=base,
    rounds=1,
    projected_kind="decoder-largest",
    projected_timeout=1800.0,
    notes=(
        "Counted, not measured: each candidate micro-batch is a full count of the method's step (device peak under "
        "the row's cap, host peak against 128 GiB); `oom` means not even one sequence a micro-batch fits, and the "
        "record keeps the counts that say where. The search starts where the counts at one and two samples, "
        "extended in a line, meet a cap, and counts on from there (experiments/decoder_largest.py). The device "
        "and host by role at the largest micro-batch are in the table below. The peers and the pipelines have no "
        "row: the peers' offload cannot be counted on fake tensors, and a pipeline's micro-batches are its schedule's."
    ),
)
