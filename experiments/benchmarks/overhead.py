"""Overhead of the layered view and keyed randomness against a plain Hugging Face forward/backward step."""

from __future__ import annotations

import itertools
import statistics
import time

import torch

from experiments.benchmarks.common import benchmark, defaults
from suite.core.check import build_method
from suite.core.experiment import Row
from suite.core.registry import Option
from suite.harness.data import synthetic_batch, synthetic_batches
from suite.harness.device import autocast, read_step, synchronize
from suite.harness.loss_scale import DynamicLossScaler
from suite.harness.model import build_model, plain_copy
from suite.harness.optim import LayerwiseOptimizer
from suite.measure import flops

# The model and minibatch each profile times.
PROFILES = {
    "tiny": {"model.preset": "tiny", "seq_len": 128, "micro_batch_size": 8, "num_micro_batches": 2},
    "small": {"model.preset": "bert-base", "seq_len": 128, "micro_batch_size": 8, "num_micro_batches": 2},
    "paper": {"model.preset": "bert-large", "seq_len": 512, "micro_batch_size": 2, "num_micro_batches": 4},
}

# Warm-up and timed repeats: BERT-Base's step takes seconds on a CPU, BERT-Large's a fraction of one on a GPU.
REPEATS = {"tiny": {"warmup": 3, "steps": 20}, "small": {"warmup": 2, "steps": 5}, "paper": {"warmup": 3, "steps": 10}}


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


def plain_loop(model, run, device: torch.device):
    """A user's own training step on the same weights: the stock Hugging Face model (its native dropout and default
    attention), one optimizer over every parameter with the method's settings and kernels, the same loss scaler
    under fp16, autocast under 16-bit, and the loss read back once at the end."""
    plain = plain_copy(model).to(device)
    opt = LayerwiseOptimizer([list(plain.named_parameters())], run)
    scaler = DynamicLossScaler(enabled=run.precision == "fp16")
    params = [p for p in plain.parameters() if p.requires_grad]
    count = [0]

    def step(batch) -> float:
        for p in params:
            p.grad = None
        total = 0.0
        for mb in batch.split(run.num_micro_batches):
            mb = mb.to(device, non_blocking=True)
            with autocast(device, run.precision):
                out = plain(
                    input_ids=mb.input_ids,
                    attention_mask=mb.attention_mask,
                    token_type_ids=mb.token_type_ids,
                    labels=mb.labels,
                )
            loss = out.loss.float() * (mb.size / batch.size)
            scaler.scale_loss(loss).backward()
            total += loss.detach()
        skipped = False
        if scaler.enabled:
            value, skipped = read_step(total, scaler.unscale_([p.grad for p in params if p.grad is not None]))
        scaler.update(skipped)
        if not skipped:
            opt.step(count[0])
        count[0] += 1
        return value if scaler.enabled else read_step(total)[0]

    step.model = plain
    return step


def compare_steps(run, device: torch.device) -> dict:
    """The suite's whole step (run.method: grad_accum or amp) against the plain loop, in `rounds` interleaved rounds
    of `steps` steps each (the order alternating round by round) after `warmup` steps of each: per-round ratios."""
    method = build_method(run, device)
    plain = plain_loop(method.model, run, device)
    batches = list(itertools.islice(synthetic_batches(run), run.steps))
    sides = {"layered": method.step, "plain": plain}
    for _ in range(run.warmup):
        for fn in sides.values():
            fn(batches[0])
    times: dict[str, list[float]] = {"layered": [], "plain": []}
    for r in range(run.options["rounds"]):
        for name in ("layered", "plain") if r % 2 == 0 else ("plain", "layered"):
            synchronize(device)
            t0 = time.perf_counter()
            for batch in batches:
                sides[name](batch)
            synchronize(device)
            times[name].append((time.perf_counter() - t0) / len(batches))
    ratios = [a / b for a, b in zip(times["layered"], times["plain"])]
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "layered_step_s": med["layered"],
        "plain_step_s": med["plain"],
        "layered_over_plain": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_rounds": ratios,
        "layered_samples_per_s": run.batch_size / med["layered"],
        "plain_samples_per_s": run.batch_size / med["plain"],
        "repeats": run.steps,
        "rounds": run.options["rounds"],
    }
    if device.type == "cuda":  # what each achieves of the device's peak (suite.measure.flops)
        peak = flops.peak_tflops(torch.cuda.get_device_name(device), run.precision)
        per = flops.per_sample(run)["flops_per_sample"]
        for side in ("layered", "plain"):
            out[f"{side}_tflops"] = out[f"{side}_samples_per_s"] * per / 1e12
            out[f"{side}_mfu"] = out[f"{side}_tflops"] / peak if peak else None
    return out


def overhead_cell(run, device: torch.device, cap) -> dict:
    """The cell, in this one process: forward and backward alone (`run.options["compare"]` = forward-backward:
    `warmup` repeats of both, then `steps` timed ones, interleaved), or the whole training step (step)."""
    if run.options["compare"] == "step":
        return compare_steps(run, device)
    return compare(run, device, run.steps, run.warmup)


def config_text(profile: str) -> str:
    return " ".join(f"{k}={v}" for k, v in PROFILES[profile].items())


SETTINGS = {
    "compare": Option("forward-backward", ("forward-backward", "step"), "what is timed against plain Hugging Face"),
    "rounds": Option(5, help="interleaved rounds of `steps` whole steps each (compare=step)"),
}


def rows(profile: str) -> list[Row]:
    """The forward and backward alone, then the suite's grad_accum and amp steps against a plain training loop
    (amp: fp16 with loss scaling on the paper's GPU, bf16 on a CPU)."""
    amp = "fp16" if profile == "paper" else "bf16"
    label = lambda extra="": {"config": config_text(profile) + extra}  # noqa: E731
    return [
        Row("layered-vs-plain", "grad_accum", labels=label()),
        Row("grad_accum-vs-hf", "grad_accum", {"compare": "step"}, labels=label(" (whole step, fp32)")),
        Row("amp-vs-hf", "amp", {"compare": "step", "precision": amp}, labels=label(f" (whole step, {amp})")),
    ]


EXPERIMENT = benchmark(
    "bench-overhead",
    "Overhead of the layered view + keyed randomness vs a plain Hugging Face step",
    "the harness itself: its one model view and keyed dropout against the Hugging Face model's own forward",
    [
        ("layered_step_s", "layered (s)", "{:.4f}"),
        ("plain_step_s", "plain HF (s)", "{:.4f}"),
        ("layered_over_plain", "ratio", "{:.3f}"),
        ("ratio_min", "ratio min", "{:.3f}"),
        ("ratio_max", "ratio max", "{:.3f}"),
    ],
    label_columns=["config"],
    rows=rows,
    base=lambda profile: {**PROFILES[profile], **REPEATS[profile], **defaults(SETTINGS)},
    settings=SETTINGS,
    notes=(
        "`layered-vs-plain`: forward and backward of every micro-batch (no optimizer) on the same weights and batch, "
        "through the layered view (keyed dropout) and through the plain Hugging Face model; `warmup` repeats, then "
        "the median of `steps` (`--set steps=N`) repeats, the two interleaved in one process so that drift hits both "
        "alike. `grad_accum-vs-hf`, `amp-vs-hf`: the suite's whole step (the method's own, its per-layer optimizers "
        "included) against a user's plain loop on the same weights (the stock model's native dropout and default "
        "attention, one optimizer with the same settings and kernels, the same loss scaler under fp16, the loss read "
        "once): `rounds` interleaved rounds of `steps` steps each, the order alternating; the ratio is the median of "
        "the rounds' ratios, min and max beside it. Ratio: layered / plain. Target: at most 1.05 (on CUDA, fp32 and "
        "amp). `make bench` runs it."
    ),
)
