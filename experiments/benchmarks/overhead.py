"""Overhead of the layered view and keyed randomness against a plain Hugging Face forward/backward step."""

from __future__ import annotations

import statistics
import time

import torch

from experiments.benchmarks.common import benchmark
from suite.core.experiment import Row
from suite.harness.data import synthetic_batch
from suite.harness.device import synchronize
from suite.harness.model import build_model, plain_copy

# The model and minibatch each profile times.
PROFILES = {
    "tiny": {"model.preset": "tiny", "seq_len": 128, "micro_batch_size": 8, "num_micro_batches": 2},
    "small": {"model.preset": "bert-base", "seq_len": 128, "micro_batch_size": 8, "num_micro_batches": 2},
    "paper": {"model.preset": "bert-large", "seq_len": 512, "micro_batch_size": 2, "num_micro_batches": 4},
}


def make_steps(run, device: torch.device):
    """Two closures doing the same forward/backward over the same micro-batches and weights."""
    model = build_model(run.model, run.seed).to(device)
    plain = plain_copy(model).to(device)
    batch = synthetic_batch(0, run.batch_size, run.seq_len, run.model.vocab_size, run.model.num_labels, run.seed)
    mbs = [mb.to(device) for mb in batch.split(run.num_micro_batches)]

    def layered():
        for mb in mbs:
            ctx = model.begin(mb, run.seed, 0, batch.size)
            model.forward_micro_batch(ctx).backward()

    def hf():
        for mb in mbs:
            out = plain(
                input_ids=mb.input_ids,
                attention_mask=mb.attention_mask,
                token_type_ids=mb.token_type_ids,
                labels=mb.labels,
            )
            (out.loss * (mb.size / batch.size)).backward()

    return layered, hf


def compare(run, device: torch.device, repeats: int = 20, warmup: int = 3) -> dict:
    """Median step time of each, measured interleaved so drift hits both alike; ratio layered / plain."""
    layered, hf = make_steps(run, device)
    times = {"layered": [], "plain": []}
    for i in range(warmup + repeats):
        for name, fn in (("layered", layered), ("plain", hf)):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "layered_step_s": med["layered"],
        "plain_step_s": med["plain"],
        "layered_over_plain": med["layered"] / med["plain"],
        "repeats": repeats,
    }


def overhead_cell(run, device: torch.device, cap) -> dict:
    """The cell: `run.warmup` repeats of both steps, then `run.steps` timed ones, interleaved in this one process."""
    return compare(run, device, run.steps, run.warmup)


def config_text(profile: str) -> str:
    return " ".join(f"{k}={v}" for k, v in PROFILES[profile].items())


EXPERIMENT = benchmark(
    "bench-overhead",
    "Overhead of the layered view + keyed randomness vs a plain Hugging Face step",
    "the harness itself: its one model view and keyed dropout against the Hugging Face model's own forward",
    [
        ("layered_step_s", "layered (s)", "{:.4f}"),
        ("plain_step_s", "plain HF (s)", "{:.4f}"),
        ("layered_over_plain", "ratio", "{:.3f}"),
    ],
    label_columns=["config"],
    rows=lambda profile: [Row("layered-vs-plain", "grad_accum", labels={"config": config_text(profile)})],
    base=lambda profile: {**PROFILES[profile], "warmup": 3, "steps": 20},
    notes=(
        "Forward and backward of every micro-batch (no optimizer) on the same weights and batch, through the layered "
        "view (keyed dropout) and through the plain Hugging Face model; `warmup` repeats, then the median of `steps` "
        "(`--set steps=N`) repeats, the two interleaved in one process so that drift hits both alike. "
        "Ratio: layered / plain. Target: ratio <= 1.05. `make bench` runs it."
    ),
)
