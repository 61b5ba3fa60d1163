"""`make decoder`'s searches, by counts on fake tensors: the largest Llama-shaped model each method fits on one 80 GB
GPU with a 128 GiB and with a 1 TiB host (over the depth at Llama 3 8B's width), and the largest micro-batch each
fits at every size and sequence length (experiments/decoder_batch.py). Both run the `decoder-largest` kind."""

from __future__ import annotations

import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import torch

from experiments.decoder import HOSTS, SEQ
from suite.config.errors import ConfigError
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
# What a search may grow, and the name of its answer in the record.
OVER = {"layers": "max_layers", "micro_batch_size": "max_micro_batch"}
MOST = 4096  # the search's upper bound, in either dimension


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


def _at(run, over: str, n: int):
    if over == "layers":
        return dataclasses.replace(run, model=dataclasses.replace(run.model, layers=n))
    return dataclasses.replace(run, micro_batch_size=n)


def affine_guess(count, device_cap: int, host_cap: int) -> int:
    """Where the search starts: the device and host peaks counted at 1 and 2 (of layers or samples), extended in a
    line to the caps. Identical layers and samples make both peaks close to affine in either; the search's own
    counts then decide (two more when the guess is right), so a wrong guess costs counts, never the answer."""
    one, two = count(1), count(2)
    if "oom" in one or "oom" in two:
        return 1
    guesses = [MOST]
    for key, cap in (("device_peak_allocated", device_cap), ("host_peak_bytes", host_cap)):
        a, b = one.get(key, 0), two.get(key, 0)
        if b > a:
            guesses.append(1 + int((cap - a) // (b - a)))
    return max(1, min(guesses))


def largest(run, device, cap) -> dict:
    """The most layers (or samples per micro-batch: the projection's `over`) whose count fits the device cap and
    whose counted host peak fits the row's host; every count the search made is kept."""
    from methods.pipeline.planner.largest import params_billion, search
    from suite.core.cell import count_cell

    projection = run.options["projection"]
    over = projection.get("over", "layers")
    if over not in OVER:
        raise ConfigError(f"a search grows one of {', '.join(OVER)}, not {over!r}")
    host = parse_size(projection["host"])
    plain = dataclasses.replace(run, options={k: v for k, v in run.options.items() if k != "projection"})
    counts: dict[int, dict] = {}

    # Each count in a fresh process: FakeTensorMode's global state, left by one count, has crashed the next in one
    # process (torch 2.13: a segfault in a weakref finalizer inside the fake-tensor cache).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:

        def count(n: int) -> dict:
            if n not in counts:
                try:
                    counts[n] = pool.submit(count_cell, _at(plain, over, n), device, cap).result()
                except torch.OutOfMemoryError as exc:
                    counts[n] = {"oom": str(exc).splitlines()[0]}
            return counts[n]

        def fits(n: int) -> bool:
            c = count(n)
            return "oom" not in c and c.get("host_peak_bytes", 0) <= host

        guess = affine_guess(count, parse_size(plain.device_memory), host)
        best = search(fits, guess=guess, least=1, most=MOST)
    tried = {
        str(n): "device oom" if "oom" in c else f"{c['memory_gb']:.1f} GB, host {c.get('host_peak_gb', 0):.0f} GB"
        for n, c in sorted(counts.items())
    }
    answer = OVER[over]
    if best == 0:
        what = "one block" if over == "layers" else "one sample a micro-batch"
        host_gib = f"{host / 2**30:.0f} GiB"
        err = torch.OutOfMemoryError(f"counted: not even {what} fits {plain.device_memory} with a {host_gib} host")
        err.metrics = {answer: 0, "searched": tried, "guess": guess}
        raise err
    at_best = _at(plain, over, best)
    return {
        **counts[best],
        answer: best,
        "max_params_billion": params_billion(at_best),
        "tokens_per_micro_batch": at_best.micro_batch_size * at_best.seq_len,
        "host_cap_gb": host / 1e9,
        "searched": tried,
        "guess": guess,
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
        "not bound them; L2L keeps FP32 masters and AdamW's moments on the host (12 bytes a parameter, 14 under "
        "CMP with its 16-bit upload copy), its gradients applied as they land (overlap on, no gate: a ring of "
        "three of the largest layer's, not one a parameter). One GPU: the pipelines need several. FSDP2's and "
        "ZeRO's offload cannot be counted on fake tensors (FSDP2 counts without it on a CPU, ZeRO not at all), so "
        "they have no row."
    ),
)
