"""The planner's cost model beyond measurement: per-layer costs from FLOPs on a stated device, and links."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from methods.pipeline.planner.costs import GRAD_AND_STATE_BYTES, DeviceSpec, LayerCost, Line, Link, Links, Profile
from suite.config.files import read_object, write_atomic

# ---------------------------------------------------------------------------------------------------
# Analytic profiles: a transformer's FLOPs at an achieved rate, activations by the standard count.

# The 2BW paper's cluster: p3.16xlarge servers, 8x V100-16GB with NVLink; about 45 TFLOP/s achieved on
# one worker (§5, "Implementation"). NVLink ~ 150 GB/s per direction per GPU and 25 Gbit/s between servers
# are AWS's published figures, not the paper's: projections carry that assumption in their notes.
V100_P3 = DeviceSpec(
    "V100-16GB (p3.16xlarge)",
    flops=45e12,
    memory=16e9,
    intra=Link(10e-6, 150e9),
    inter=Link(50e-6, 25e9 / 8),
    optimizer_s_per_param=1e-11,
)
DEVICE_SPECS = {"v100": V100_P3}


# Kernel efficiency grows with the tokens in a micro-batch: eff(b) ~ b s / (b s + HALF_TOKENS), scaled so
# that `spec.flops` is reached at FULL_RATE_SAMPLES samples. Time(b) is then exactly a line a + slope * b.
HALF_TOKENS = 512
FULL_RATE_SAMPLES = 8


def _flops_line(flops_per_sample: float, seq_len: int, spec: DeviceSpec) -> Line:
    full = FULL_RATE_SAMPLES * seq_len
    slope = flops_per_sample / spec.flops * full / (full + HALF_TOKENS)
    return Line(slope * HALF_TOKENS / seq_len, slope)


def analytic_profile(
    layers: int, hidden: int, heads: int, seq_len: int, vocab: int, spec: DeviceSpec, mixed_precision: bool = True
) -> Profile:
    """A GPT-style transformer's per-layer cost from FLOPs at `spec.flops` and the usual activation count.

    Block forward FLOPs per sample: 24 s h^2 + 4 s^2 h; backward twice that. Activation bytes kept per
    sample and block under mixed precision: s h (34 + 5 a s / h) (Korthikanti et al., 2022); the block's
    output, the stash under recompute, is 2 s h bytes.
    """
    s, h = seq_len, hidden
    byte = 2 if mixed_precision else 4
    block_flops = 24 * s * h * h + 4 * s * s * h
    keep = s * h * (34 + 5 * heads * s / h) * (byte / 2)
    out = byte * s * h
    blk = LayerCost(
        "block",
        12 * h * h + 13 * h,
        _flops_line(block_flops, s, spec),
        _flops_line(2 * block_flops, s, spec),
        keep,
        out,
        out,
    )
    head_flops = 2 * s * h * vocab
    embed = LayerCost("embed", (vocab + s) * h, Line(0.0, 0.0), Line(0.0, 0.0), out, out, 0.0)
    head = LayerCost(
        "head",
        vocab * h + 2 * h,
        _flops_line(head_flops, s, spec),
        _flops_line(2 * head_flops, s, spec),
        byte * s * vocab * 2,
        0.0,
        byte * s * vocab,
    )
    # Mixed precision: FP16 weight copies (2 B each version) beside FP32 masters, gradients and Adam moments (16 B).
    return Profile(
        f"analytic: {spec.name}",
        seq_len,
        [embed, *[dataclasses.replace(blk, name=f"block{i + 1}") for i in range(layers)], head],
        weight_bytes_per_param=byte,
        state_bytes_per_param=16 if mixed_precision else GRAD_AND_STATE_BYTES,
        optimizer_s_per_param=spec.optimizer_s_per_param,
        p2p=spec.intra,
        all_reduce=spec.intra,
        memory=spec.memory,
        # The paper's Megatron-based code: fused Adam and bucketed all-reduce, no whole-stage transients.
        optimizer_temp_bytes_per_param=0.0,
        all_reduce_buffer_bytes_per_param=0.0,
        holds_sends=False,
    )


# ---------------------------------------------------------------------------------------------------
# Links calibrated by the last `planned` cell on this machine (JSON per host); without them the planner assumes these.
ASSUMED_CPU_LINK = Link(latency=100e-6, bandwidth=1e9)


def links_path(cache_dir: Path) -> Path:
    """This host's calibrated links under `cache_dir`."""
    return Path(cache_dir) / f"links-{os.uname().nodename}.json"


def save_links(cache_dir: Path, p2p: Link | None, all_reduce: Link | None) -> None:
    """Store the links calibrated here (None keeps the one stored before)."""
    path = links_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = read_object(path) or {}  # none, or cut short: what is calibrated now replaces it
    new = {k: dataclasses.asdict(v) for k, v in (("p2p", p2p), ("all_reduce", all_reduce)) if v is not None}
    write_atomic(path, json.dumps({**old, **new}, indent=1))


def load_links(cache_dir: Path) -> Links:
    """The links calibrated here before, else the assumed CPU link for either."""
    path = links_path(cache_dir)
    saved = read_object(path) or {}  # none, or cut short (a killed run): the assumed link until calibrated again

    def link(name: str) -> Link:
        try:
            return Link(**saved[name])
        except (KeyError, TypeError):
            return ASSUMED_CPU_LINK

    return Links(p2p=link("p2p"), all_reduce=link("all_reduce"))
