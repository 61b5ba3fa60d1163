"""Overhead of the layered view and keyed randomness against a plain Hugging Face forward/backward step, of the
suite's whole steps against a plain loop, and of Table 3's AMP-recompute and L2L-CMP steps at Table 3's shape against
a user's own Hugging Face loop (torch's fused AdamW, GradScaler, checkpointing): speed, peak memory, MFU."""

from __future__ import annotations

import itertools
import math
import statistics
import time

import torch

from experiments.benchmarks.common import benchmark, defaults, md_table, measured
from experiments.l2l_common import bert_base
from experiments.table3 import _UBATCH as TABLE3_UBATCH
from experiments.table3 import L2L_OPTIONS
from suite.core.check import build_method
from suite.core.experiment import Row
from suite.core.registry import Option
from suite.harness import rng
from suite.harness.data import synthetic_batch, synthetic_batches
from suite.harness.device import autocast, read_step, synchronize
from suite.harness.loss_scale import DynamicLossScaler
from suite.harness.model import ATTN_IMPL, build_model, plain_copy
from suite.harness.optim import LayerwiseOptimizer, no_decay
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


def recomputes(run) -> bool:
    """Whether the suite's step runs each block's forward again in the backward: AG and AMP with recompute=on, and
    the L2L methods, which always do (each layer is recomputed from its stashed input)."""
    return run.method in ("l2l", "l2l-cmp") or str(run.options.get("recompute", "off")).lower() in ("on", "true")


def torch_adamw(plain, run, device: torch.device) -> tuple[torch.optim.Optimizer, str]:
    """What a user writes: one torch AdamW over the model, BERT's no-decay groups, the run's hyper-parameters; fused
    where torch offers it for these tensors (CUDA; recent torch on a CPU too), else torch's foreach kernels."""
    named = [(n, p) for n, p in plain.named_parameters() if p.requires_grad]
    groups = [
        dict(params=[p for n, p in named if not no_decay(n)], weight_decay=run.weight_decay),
        dict(params=[p for n, p in named if no_decay(n)], weight_decay=0.0),
    ]
    hyper = dict(lr=run.lr, betas=(run.beta1, run.beta2), eps=run.eps)
    try:
        return torch.optim.AdamW(groups, **hyper, fused=True), f"AdamW (torch, fused, {device.type})"
    except (RuntimeError, ValueError):  # no fused kernel for this device
        return torch.optim.AdamW(groups, **hyper, foreach=True), f"AdamW (torch, foreach, {device.type})"


def plain_loop(model, run, device: torch.device, user: bool = False):
    """A user's own training step on the same weights: the stock Hugging Face model (its native dropout, SDPA
    attention), the same micro-batches and loss normalisation, autocast under 16-bit, and the loss read back once at
    the end. Optimizer and scaler: with `user` False, one optimizer over every parameter with the method's settings
    and kernels and the suite's loss scaler under fp16 (so that the harness's own cost is what differs); with `user`,
    what a user writes: torch's AdamW (fused), torch's GradScaler under fp16, and the model's own activation
    checkpointing (each layer) where the suite's step recomputes. The step function carries the model, the
    optimizer's and attention's names, whether it checkpoints, and its parameters."""
    plain = plain_copy(model)
    checkpointing = user and recomputes(run)
    if checkpointing:  # non-reentrant on every transformers (its default since 5; 4.x defaulted to reentrant)
        kwargs = {"use_reentrant": False}
        if hasattr(plain, "activation_checkpointing_enable"):  # transformers 5.2x's name; the old one deprecated
            plain.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    plain.to(device)
    params = [p for p in plain.parameters() if p.requires_grad]
    if user:
        opt, opt_name = torch_adamw(plain, run, device)
        scaler = torch.amp.GradScaler(device.type, enabled=run.precision == "fp16")
        scale = scaler.scale
    else:
        opt = LayerwiseOptimizer([list(plain.named_parameters())], run)
        opt_name = f"{_optimizer_name(run)} (the suite's, one over the model, the method's kernels)"
        scaler = DynamicLossScaler(enabled=run.precision == "fp16")
        scale = scaler.scale_loss
    count = [0]

    def forward_backward(batch) -> torch.Tensor:
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
            scale(loss).backward()
            total += loss.detach()
        return total

    def step(batch) -> float:
        for p in params:
            p.grad = None
        total = forward_backward(batch)
        skipped = False
        if scaler.enabled:
            value, skipped = read_step(total, scaler.unscale_([p.grad for p in params if p.grad is not None]))
        scaler.update(skipped)
        if not skipped:
            opt.step(count[0])
        count[0] += 1
        return value if scaler.enabled else read_step(total)[0]

    def user_step(batch) -> float:
        opt.zero_grad(set_to_none=True)
        total = forward_backward(batch)
        scaler.step(opt)  # fused AdamW takes the scale and the overflow flag itself: no unscale pass, no sync
        scaler.update()
        return read_step(total)[0]

    fn = user_step if user else step
    fn.model, fn.params, fn.optimizer, fn.checkpointing = plain, params, opt_name, checkpointing
    fn.attention = plain.config._attn_implementation
    fn.loss_scale = scaler.get_scale if user else lambda: scaler.scale  # 1.0 where no scaler runs
    return fn


def _optimizer_name(run) -> str:
    return {"lamb": "LAMB", "adamw": "AdamW"}.get(run.optimizer, run.optimizer)


def suite_optimizer(method) -> str:
    """The suite side's optimizer, in words: per layer on the device (AG, AMP), or on the host (L2L's server)."""
    run, opts = method.run, method.opts
    if "host_optim" in opts:
        overlap = ", overlapping the backward" if opts.get("overlap") == "on" else ""
        return f"{_optimizer_name(run)} (the suite's, per layer on the host, {opts['host_optim']} kernels{overlap})"
    if method.device.type == "cpu":
        return f"{_optimizer_name(run)} (the suite's, per layer on the device, fused kernels)"
    if run.optimizer == "lamb":
        return "LAMB (the suite's, every layer in one multi-tensor Triton pass on the device)"
    return f"{_optimizer_name(run)} (the suite's, per layer on the device, foreach kernels)"


def suite_attention(run, device: torch.device) -> str:
    """The suite side's attention: the layered view's keyed-dropout attention (SDPA when no dropout is drawn)."""
    if run.model.attention_dropout == 0.0:
        return f"{ATTN_IMPL} (SDPA, no dropout)"
    how = "Triton kernel" if rng.path_for(device) == "hash_triton" else "materialised"
    return f"{ATTN_IMPL} (keyed dropout, {how})"


class Residency:
    """Each side's device memory, both sides living in one process (CUDA; nothing elsewhere).

    Between its timed blocks a side keeps its weights, optimizer state and persistent buffers; its gradients are
    freed after each of its blocks. Its resident bytes are read whenever it has just run and the other has not
    changed since (allocated now, less the other's resident, less what the process held before either was built);
    its peak is the allocator's peak during its own block (reset at the block's start) less the other side's
    resident bytes: what it would peak at alone on the device. The raw peak (both sides' state) is kept beside it.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.base = self._allocated()
        self.resident = {"layered": 0, "plain": 0}
        self.peak = {"layered": 0, "plain": 0}
        self.raw = {"layered": 0, "plain": 0}

    def _allocated(self) -> int:
        if not self.cuda:
            return 0
        synchronize(self.device)
        return torch.cuda.memory_allocated(self.device)

    @staticmethod
    def other(side: str) -> str:
        return "plain" if side == "layered" else "layered"

    def settled(self, side: str) -> None:
        """`side` has just run (or been built), its gradients freed; the other has not changed since it last did."""
        self.resident[side] = self._allocated() - self.base - self.resident[self.other(side)]

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def end(self, side: str) -> None:
        if self.cuda:
            raw = torch.cuda.max_memory_allocated(self.device) - self.base
            self.raw[side] = max(self.raw[side], raw)
            self.peak[side] = max(self.peak[side], raw - self.resident[self.other(side)])

    def metrics(self) -> dict:
        gb = (lambda v: v / 1e9) if self.cuda else (lambda v: None)  # noqa: E731
        out = {"memory_kind": MEMORY_KIND if self.cuda else None}
        for side in ("layered", "plain"):
            out[f"{side}_peak_gb"] = gb(self.peak[side])
            out[f"{side}_resident_gb"] = gb(self.resident[side])
            out[f"{side}_peak_in_process_gb"] = gb(self.raw[side])
        out["peak_ratio"] = self.peak["layered"] / self.peak["plain"] if self.cuda and self.peak["plain"] else None
        return out


MEMORY_KIND = (
    "cuda max_memory_allocated during the side's timed steps, less the other side's resident bytes (weights, "
    "optimizer state, persistent buffers; gradients freed between blocks)"
)


def _drop_grads(params, device: torch.device) -> None:
    """Free the gradients a side keeps on the GPU after its step (each side frees them at its next step's start
    anyway), so that the other side's steps run beside its weights and optimizer state alone. Only on CUDA, where
    memory is measured, and only gradients on the device: L2L's parameters hold views of its host server's
    gradient buffers, which its host optimizer reads."""
    if device.type != "cuda":
        return
    for p in params:
        if p.grad is not None and p.grad.device.type == "cuda":
            p.grad = None


def compare_steps(run, device: torch.device) -> dict:
    """The suite's whole step (run.method) against the plain loop (`plain`: same-optimizer, or user: torch's fused
    AdamW and GradScaler, activation checkpointing where the suite recomputes), in `rounds` interleaved rounds of
    `steps` steps each (the order alternating round by round), each side first warmed up alone for `warmup` steps:
    per-round ratios, and each side's peak device memory (Residency)."""
    user = run.options.get("plain", "same-optimizer") == "user"
    mem = Residency(device)
    method = build_method(run, device)
    mem.settled("layered")
    plain = plain_loop(method.model, run, device, user=user)  # from the weights before any step: the same
    mem.settled("plain")
    batches = list(itertools.islice(synthetic_batches(run), run.steps))
    updater = getattr(method, "updater", None)  # L2L's host updates, which may still run after step() returns

    def suite_block(batches) -> int:
        """The suite's steps; the fp16 overflows that skipped an update among them."""
        return sum(bool(method.step(batch).skipped) for batch in batches)

    def plain_block(batches) -> int:
        before = plain.loss_scale()
        for batch in batches:
            plain(batch)
        return round(math.log2(before / plain.loss_scale()))  # each overflow halves the scale (no growth this soon)

    def finish() -> None:
        # L2L's commits of the last step (its next step's forward would wait for them): charged to its block
        if updater is not None:
            updater.drain()
            synchronize(device)

    sides = {
        "layered": (suite_block, finish, list(method.model.parameters())),
        "plain": (plain_block, lambda: None, plain.params),
    }
    for name, (block, done, params) in sides.items():
        block(batches[:1] * run.warmup)
        done()
        _drop_grads(params, device)
        mem.settled(name)
    times: dict[str, list[float]] = {"layered": [], "plain": []}
    skipped = {"layered": 0, "plain": 0}
    tails: list[float] = []
    for r in range(run.options["rounds"]):
        for name in ("layered", "plain") if r % 2 == 0 else ("plain", "layered"):
            block, done, params = sides[name]
            synchronize(device)
            mem.start()
            t0 = time.perf_counter()
            skipped[name] += block(batches)
            synchronize(device)
            t1 = time.perf_counter()
            done()
            t2 = time.perf_counter()
            times[name].append((t2 - t0) / len(batches))
            if name == "layered":
                tails.append(t2 - t1)
            mem.end(name)
            _drop_grads(params, device)
            mem.settled(name)
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
        # After each block's last step, the time its host work (L2L's commits) still took: inside layered_step_s
        "layered_tail_s": statistics.median(tails),
        "layered_method": run.method,
        "layered_optimizer": suite_optimizer(method),
        "layered_attention": suite_attention(run, device),
        "layered_recompute": recomputes(run),
        "plain_optimizer": plain.optimizer,
        "plain_attention": plain.attention,
        "plain_checkpointing": plain.checkpointing,
        "plain": "user" if user else "same-optimizer",
        # Timed steps whose update an fp16 overflow skipped (both scalers start at 2^16 and halve on one)
        "layered_skipped_steps": skipped["layered"],
        "plain_skipped_steps": skipped["plain"],
        **mem.metrics(),
    }
    if device.type == "cuda":  # what each achieves of the device's peak, Table 3's convention (flops.cuda_metrics)
        name = torch.cuda.get_device_name(device)
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
        peak = flops.peak_tflops(name, run.precision, tf32)
        # Model FLOPs for both sides: a recompute's extra forward (either side's) is not counted, as in Table 3's MFU
        per = flops.per_sample(run)["flops_per_sample"]
        out.update(flops_per_sample=per, peak_tflops=peak)
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
    # Not in the base config (the earlier rows' cell keys stay as they were): the rows against a user's loop set it.
    "plain": Option(
        "same-optimizer",
        ("same-optimizer", "user"),
        "compare=step: the plain loop's optimizer and scaler: the suite's (same-optimizer), or a user's (torch's fused "
        "AdamW, GradScaler, activation checkpointing where the suite recomputes)",
    ),
}
BASE_SETTINGS = ("compare", "rounds")

# Table 3's rows at their own shape (paper: BERT-Large, 64 x 512 a micro-batch, fp16, LAMB; experiments/table3.py),
# the profile's own shape elsewhere, against a user's loop. Timed: `warmup` steps of each side alone, then `rounds`
# interleaved rounds of `steps` steps; at `paper` five steps a round over three rounds (a 4-micro-batch step is 1-2.5 s
# on an H100): the ratio's median and spread rest on 15 timed steps a side, not on three one-step rounds (issue 51).
TABLE3_UBATCHES = (1, 4)
TABLE3_OPTIONS = {"amp-rc": ("amp", {"recompute": "on"}), "l2l-cmp": ("l2l-cmp", L2L_OPTIONS)}
TABLE3_REPEATS = {
    "tiny": {"warmup": 1, "steps": 2, "rounds": 3},
    "small": {"warmup": 1, "steps": 1, "rounds": 3},
    "paper": {"warmup": 1, "steps": 5, "rounds": 3},
}


def table3_rows(profile: str, amp: str) -> list[Row]:
    """The suite's AMP recomputing per layer and its L2L-CMP (Table 3's `amp-rc-u*` and `l2l-cmp-u*` options) at
    1 and 4 micro-batches against a user's plain Hugging Face loop."""
    shape = {"micro_batch_size": TABLE3_UBATCH["paper"]} if profile == "paper" else {}
    table = {k: bert_base("paper")[k] for k in ("optimizer", "lr")}  # LAMB, as every L2L table
    out = []
    for label, (method, options) in TABLE3_OPTIONS.items():
        for u in TABLE3_UBATCHES:
            over = {**shape, "num_micro_batches": u, "precision": amp, **table, **options, **TABLE3_REPEATS[profile]}
            run = {**PROFILES[profile], **over}
            config = " ".join(f"{k}={run[k]}" for k in ("model.preset", "seq_len", "micro_batch_size"))
            labels = {
                "config": f"{config} num_micro_batches={u} (whole step, {amp}; Table 3's {label}-u{u})",
                "against": "user loop: torch AdamW (fused), GradScaler, SDPA, checkpointing",
            }
            out.append(Row(f"table3-{label}-u{u}-vs-hf", method, {"compare": "step", "plain": "user", **over}, labels))
    return out


def rows(profile: str) -> list[Row]:
    """The forward and backward alone, then the suite's grad_accum and amp steps against a plain training loop
    (amp: fp16 with loss scaling on the paper's GPU, bf16 on a CPU), then Table 3's AMP-recompute and L2L-CMP rows
    against a user's loop."""
    amp = "fp16" if profile == "paper" else "bf16"
    label = lambda extra="": {"config": config_text(profile) + extra}  # noqa: E731
    same = {"against": "plain loop: the suite's optimizer and scaler, SDPA"}
    return [
        Row("layered-vs-plain", "grad_accum", labels=label()),
        Row("grad_accum-vs-hf", "grad_accum", {"compare": "step"}, labels={**label(" (whole step, fp32)"), **same}),
        Row(
            "amp-vs-hf",
            "amp",
            {"compare": "step", "precision": amp},
            labels={**label(f" (whole step, {amp})"), **same},
        ),
        *table3_rows(profile, amp),
    ]


def _gb(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def _x(v, fmt: str = "{:.3f}") -> str:
    return "—" if v is None else fmt.format(v)


DETAIL_HEAD = [
    "row",
    "suite: method, optimizer, attention",
    "plain: optimizer, attention",
    "suite samples/s",
    "plain samples/s",
    "ratio (min-max)",
    "suite peak GB",
    "plain peak GB",
    "peak ratio",
    "suite TFLOPS (MFU)",
    "plain TFLOPS (MFU)",
    "skipped steps (suite/plain)",
]


def detail_line(name: str, m: dict) -> list[str]:
    recompute = ", recompute" if m.get("layered_recompute") else ""
    checkpoint = ", checkpointing" if m.get("plain_checkpointing") else ""

    def rate(side: str) -> str:
        tf, mfu = m.get(f"{side}_tflops"), m.get(f"{side}_mfu")
        return "—" if tf is None else f"{tf:.1f}" + ("" if mfu is None else f" ({100 * mfu:.1f}%)")

    return [
        f"`{name}`",
        f"{m['layered_method']}{recompute}; {m['layered_optimizer']}; {m['layered_attention']}",
        f"{m['plain_optimizer']}; {m['plain_attention']}{checkpoint}",
        f"{m['layered_samples_per_s']:.1f}",
        f"{m['plain_samples_per_s']:.1f}",
        f"{m['layered_over_plain']:.3f} ({m['ratio_min']:.3f}-{m['ratio_max']:.3f})",
        _gb(m.get("layered_peak_gb")),
        _gb(m.get("plain_peak_gb")),
        _x(m.get("peak_ratio")),
        rate("layered"),
        rate("plain"),
        f"{m.get('layered_skipped_steps', '—')}/{m.get('plain_skipped_steps', '—')}",
    ]


def detail(cells, records) -> list[str]:
    """The whole-step rows side by side: what each side runs, samples/s, the ratio, peak memory, TFLOPS and MFU."""
    lines = [detail_line(cell.row.name, m) for cell, m in measured(cells, records) if "layered_optimizer" in m]
    if not lines:
        return []
    return [
        "Whole steps, each side's figures (peak GB: each side's own, as the notes say; TFLOPS and MFU on CUDA):",
        "",
        *md_table(DETAIL_HEAD, lines),
        "",
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
    label_columns=["config", "against"],
    rows=rows,
    base=lambda profile: {**PROFILES[profile], **REPEATS[profile], **defaults({k: SETTINGS[k] for k in BASE_SETTINGS})},
    settings=SETTINGS,
    detail=detail,
    notes=(
        "`layered-vs-plain`: forward and backward of every micro-batch (no optimizer) on the same weights and batch, "
        "through the layered view (keyed dropout) and through the plain Hugging Face model; `warmup` repeats, then "
        "the median of `steps` (`--set steps=N`) repeats, the two interleaved in one process so that drift hits both "
        "alike. `grad_accum-vs-hf`, `amp-vs-hf`: the suite's whole step (the method's own, its per-layer optimizers "
        "included) against a plain loop on the same weights (the stock model's native dropout and SDPA attention, "
        "one optimizer with the same settings and kernels, the same loss scaler under fp16, the loss read once): "
        "each side warmed up alone for `warmup` steps, then `rounds` interleaved rounds of `steps` steps each, the "
        "order alternating; the ratio is the median of the rounds' ratios, min and max beside it. Ratio: layered / "
        "plain. Target: at most 1.05 (on CUDA, fp32 and amp). "
        "`table3-amp-rc-u{1,4}-vs-hf`, `table3-l2l-cmp-u{1,4}-vs-hf`: Table 3's rows at its shape (paper profile: "
        "BERT-Large, 64 x 512 a micro-batch, fp16 with a loss scaler, LAMB; at tiny and small the profile's shape, "
        "bf16 on a CPU), 1 and 4 micro-batches: the suite's AMP recomputing each block (recompute=on) and its "
        "L2L-CMP (stash=cpu, overlap=on; it recomputes every layer) against what a user writes (`plain=user`): the "
        "stock model on the same weights with SDPA and its own dropout, its activation checkpointing on (every "
        "layer, non-reentrant), one torch AdamW over the model (fused=True; BERT's no-decay groups, the run's "
        "hyper-parameters), autocast and torch's GradScaler under fp16, the same micro-batches and loss "
        "normalisation. So the optimizers differ (the suite's LAMB, per layer; torch's fused AdamW, one over the "
        "model) and so do the attentions (the suite's keyed-dropout kernel; SDPA with torch's dropout): the detail "
        "table names both. L2L-CMP's host commits that are still running when its last step of a round returns are "
        "waited for inside its timed block (its next step's forward would wait for them; `layered_tail_s` in the "
        "record: at one step a round it charges the whole tail, an upper bound). Both loss scalers start at 2^16 "
        "and halve on an overflow, which skips that step's update (a cheaper step): the record counts each side's "
        "skipped timed steps (`*_skipped_steps`, the detail's last column). No device-memory cap: both models "
        "share the device. Memory (CUDA; None on a CPU): each side's peak is the allocator's peak allocated bytes "
        "during its own timed steps (reset at each block's start, the largest over the rounds) less the other side's "
        "resident bytes (its weights, optimizer state and persistent buffers, read when it last ran; gradients are "
        "freed after each block), i.e. what it would peak at alone; `*_peak_in_process_gb` keeps the raw peak, "
        "`*_resident_gb` what each keeps between steps; host memory (L2L's FP32 masters and optimizer) is not "
        "counted. Peak ratio: suite / plain. TFLOPS and MFU (CUDA): the model's FLOPs per sample "
        "(suite/measure/flops.py: three forwards, a recompute's extra forward not counted, Table 3's MFU convention) "
        "times each side's samples/s, for both sides alike, over the device's dense peak at the run's precision. "
        "`make bench` runs it."
    ),
)
