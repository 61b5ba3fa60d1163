"""`make decoder`'s second table: the largest Llama-shaped model each method fits on one 80 GB GPU, with a 128 GiB and
with a 1 TiB host, found by counts (fake tensors) over the depth at Llama 3 8B's width."""

from __future__ import annotations

import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import torch

from experiments.decoder import HOSTS, SEQ
from suite.config.sizes import parse_size
from suite.core.experiment import Metric, ProjectedRow, ProjectingExperiment

DEVICE = "80GB"
# One GPU, so no pipeline; the peers' offload a count cannot follow (FSDP2 is counted without it on a CPU, ZeRO not
# at all), so their rows would not say what the GPU holds: left out, named in the notes.
METHODS = (
    ("ag-fp32", "grad_accum", {"precision": "fp32"}, "AG (FP32)"),
    ("amp", "amp", {"precision": "bf16", "recompute": "on"}, "AMP bf16, recompute per layer"),
    ("l2l", "l2l", {"precision": "fp32", "stash": "cpu", "overlap": "on"}, "L2L (FP32), stash on host"),
    ("l2l-cmp", "l2l-cmp", {"precision": "bf16", "stash": "cpu", "overlap": "on"}, "L2L-CMP bf16, stash on host"),
)


def rows(profile: str) -> list[ProjectedRow]:
    return [
        ProjectedRow(
            f"{name}-{host.replace(' ', '').lower()}",
            method,
            {"model.preset": "llama-8b", "device_memory": DEVICE, **overrides},
            {"method": label, "device": DEVICE, "host": host},
            projection={"host": HOSTS[host]},
        )
        for name, method, overrides, label in METHODS
        for host in HOSTS
    ]


def largest(run, device, cap) -> dict:
    """The most blocks at the run's width whose count fits the device cap and whose counted host peak fits the
    row's host; every count the search made is kept."""
    from methods.pipeline.planner.largest import params_billion, search
    from suite.core.cell import count_cell

    host = parse_size(run.options["projection"]["host"])
    plain = dataclasses.replace(run, options={k: v for k, v in run.options.items() if k != "projection"})
    counts: dict[int, dict] = {}

    def at(n):
        return dataclasses.replace(plain, model=dataclasses.replace(plain.model, layers=n))

    # Each count in a fresh process: FakeTensorMode's global state, left by one count, has crashed the next in one
    # process (torch 2.13: a segfault in a weakref finalizer inside the fake-tensor cache).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:

        def fits(n: int) -> bool:
            try:
                counts[n] = pool.submit(count_cell, at(n), device, cap).result()
            except torch.OutOfMemoryError as exc:
                counts[n] = {"oom": str(exc).splitlines()[0]}
                return False
            return counts[n].get("host_peak_bytes", 0) <= host

        best = search(fits, guess=32, least=1)
    tried = {
        str(n): "device oom" if "oom" in c else f"{c['memory_gb']:.1f} GB, host {c.get('host_peak_gb', 0):.0f} GB"
        for n, c in sorted(counts.items())
    }
    if best == 0:
        err = torch.OutOfMemoryError(f"counted: not even one block fits {DEVICE} with a {host / 2**30:.0f} GiB host")
        err.metrics = {"max_layers": 0, "searched": tried}
        raise err
    return {
        **counts[best],
        "max_layers": best,
        "max_params_billion": params_billion(at(best)),
        "host_cap_gb": host / 1e9,
        "searched": tried,
    }


def base(profile: str) -> dict:
    return {"seq_len": SEQ, "micro_batch_size": 1, "num_micro_batches": 1, "optimizer": "adamw", "lr": 1e-4}


EXPERIMENT = ProjectingExperiment(
    name="decoder-largest",
    title="Decoders: the largest Llama-shaped model (8B's width) each method fits on one 80 GB GPU (counted)",
    source="counts on fake tensors (docs/counting.md) at Llama 3 8B's width, sequence 4096, micro-batch 1",
    metrics=[
        Metric("max_layers", "layers", "{:.0f}", ratio=False, paper=False),
        Metric("max_params_billion", "parameters (B)", "{:.1f}", ratio=False, paper=False),
        Metric("memory_gb", "device peak", unit="GB", ratio=False, paper=False),
        Metric("host_peak_gb", "host peak (GB)", "{:.0f}", ratio=False, paper=False),
    ],
    label_columns=["method", "device", "host"],
    baseline="ag-fp32-128gib",
    rows=rows,
    base=base,
    rounds=1,
    projected_kind="decoder-largest",
    projected_timeout=1800.0,  # L2L with a 1 TiB host: counts of models some 200 layers deep
    notes=(
        "Counted, not measured: each candidate depth is a full count of the method's step (device peak under the "
        "80 GB cap, host peak against the row's host). AG and AMP keep everything on the device, so the host does "
        "not bound them; L2L keeps FP32 masters, gradients and AdamW's moments on the host (16 bytes a parameter, "
        "20 under CMP with its 16-bit copies). One GPU: the pipelines need several. FSDP2's and ZeRO's offload "
        "cannot be counted on fake tensors (FSDP2 counts without it on a CPU, ZeRO not at all), so they have no row."
    ),
)
