"""What the planner's costs are made of: per-layer time lines and bytes, links, a model's profile, a device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

# Bytes per parameter besides the weight copies: an FP32 gradient and the two moments of LAMB/AdamW.
GRAD_AND_STATE_BYTES = 4 + 8


class Line(NamedTuple):
    """Seconds linear in the micro-batch size b: intercept + slope * b (saved as [intercept, slope])."""

    intercept: float
    slope: float

    def at(self, b: int) -> float:
        return max(self.intercept + self.slope * b, 0.0)


@dataclass
class LayerCost:
    """One layer of the layered view: its forward and backward seconds as lines in b, and bytes per sample."""

    name: str
    params: int
    forward: Line
    backward: Line
    keep_bytes: float  # per sample: what a forward with autograd keeps until its backward
    out_bytes: float  # per sample: the layer's output (sent on; stashed under recompute)
    work_bytes: float = 0.0  # per sample: transient peak of the backward over what was kept

    def fwd(self, b: int) -> float:
        return self.forward.at(b)

    def bwd(self, b: int) -> float:
        return self.backward.at(b)


@dataclass
class Link:
    """A point-to-point or all-reduce link: seconds = latency + bytes / bandwidth."""

    latency: float = 0.0
    bandwidth: float = float("inf")  # bytes per second

    def seconds(self, nbytes: float) -> float:
        return 0.0 if nbytes <= 0 else self.latency + nbytes / self.bandwidth


class Links(NamedTuple):
    """A machine's two links: between neighbouring stages, and among a stage's replicas."""

    p2p: Link
    all_reduce: Link


@dataclass
class Profile:
    """Costs of every layer (embed, blocks, head) of one model at one sequence length on one device."""

    source: str  # "measured: <device, threads>" or "analytic: <device spec>"
    seq_len: int
    layers: list[LayerCost]
    weight_bytes_per_param: int = 4  # each weight version (FP32 here; 2 for FP16 copies beside FP32 masters)
    state_bytes_per_param: int = GRAD_AND_STATE_BYTES
    optimizer_s_per_param: float = 0.0
    optimizer_temp_bytes_per_param: float = 8.0  # transient of one layer's optimizer step (LAMB: two FP32 temporaries)
    all_reduce_buffer_bytes_per_param: float = (
        4.0  # ours flattens a stage's FP32 gradients for the replicas' all-reduce
    )
    # gloo's isend reports completion only when waited on, so our executor holds each step's sent tensors until
    # the step ends (NCCL sends are waited at once): m boundary tensors per direction a stage sends.
    holds_sends: bool = True
    p2p: Link = field(default_factory=Link)
    all_reduce: Link = field(default_factory=Link)
    memory: float | None = None  # bytes per device, when the source states one

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Profile":
        d = dict(d)
        d["layers"] = [
            LayerCost(**{**c, "forward": Line(*c["forward"]), "backward": Line(*c["backward"])}) for c in d["layers"]
        ]
        d["p2p"], d["all_reduce"] = Link(**d["p2p"]), Link(**d["all_reduce"])
        return Profile(**d)


@dataclass(frozen=True)
class DeviceSpec:
    """An accelerator and its links as the paper describes its cluster (assumptions, stated in every table)."""

    name: str
    flops: float  # achieved FLOP/s of a training step (the paper's own measured figure where it gives one)
    memory: float  # bytes per device
    intra: Link  # between devices of one server
    inter: Link  # between servers
    per_server: int = 8
    optimizer_s_per_param: float = 0.0
