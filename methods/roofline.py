"""A step's roofline on one GPU and its host (issue 54, item 6): what a method's step computes on the device, moves
over PCIe each way and streams through host memory, each over the rate the machine offers; the slowest names the
limit. Projected, nothing trained: the figures a GPU measures (tokens/s, the bandwidth benchmark) are held to it.

What each method moves in one step of `u` micro-batches (per parameter of N, at the wire's w bytes; every figure
from the run's model built on `meta`):
- L2L and L2L-CMP (overlap on, the relay of methods/l2l): every layer's weights up once in the forward, and again
  in the backward for the blocks below the top `block_slots` (the slots still hold those); each gradient down once;
  the block inputs down and up again where stashed on the host. The host's update streams 28 bytes a parameter
  (AdamW: reads the master, two moments and the 16-bit gradient, writes the three back and the 16-bit copy; LAMB's
  second pass and layer-sized scratch: 46), besides the copy engines' own reads and writes of host memory. The
  device, the copies and the host overlap; what cannot is the tail: the last layers' updates after the backward
  (the embeddings and the first block: the next forward starts with them) and the first upload. A gated step (fp16's
  overflow, clipping's norm taken on the device) commits nothing before the backward ends: its commits (and,
  clipped, its gradients' downloads) overlap only the next forward. The update on the device is priced beside
  (`update="device"`): each layer's FP32 master and moments up after its backward and back after its update with
  the 16-bit copy (12 + 14 bytes a parameter over the link), AdamW in device memory, the host serving copies alone.
- FSDP2 with CPU offload (torch's): the FP32 shards up to the device at every gather, forward and backward of every
  micro-batch (its gradients synchronise only at the last, so each micro-batch gathers again; once a micro-batch
  with reshard off), the FP32 gradients down once; the optimizer (torch's fused AdamW, 28 bytes a parameter) runs on
  the host after the backward, in series.
- AMP resident: no PCIe; the optimizer on the device streams its bytes at the device memory's rate after the
  backward.
The device's compute is the step's hardware FLOPs (suite.measure.flops, recompute included) at the GEMM rate, and the
bytes of its other kernels (sum_bytes: the micro-batches' gradient sums; elementwise_bytes) at the device memory's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from suite.harness.families.lm import chunk_for
from suite.measure import machines
from suite.measure.flops import per_sample

WIRE = {"fp32": 4, "fp16": 2, "bf16": 2}
HOST_UPDATE = {"adamw": 28, "lamb": 46}  # host bytes a parameter the L2L update streams (see the docstring)
DEVICE_UPDATE = 36  # bytes a parameter a resident AdamW streams (FP32 weights, gradients and moments; 16-bit copy)
STATE = 12  # bytes a parameter of L2L's FP32 master and two moments: what an update on the device brings up and back
UPDATES = ("host", "device")  # where L2L's update runs (project's `update`)


@dataclass(frozen=True)
class Machine:
    """One GPU, its link and its host, each rate with where it comes from."""

    name: str
    gpu: str  # the name torch reports, for the dense peak (the machine catalogue's)
    gemm_tflops: float  # achieved in a decoder block's matmuls at bf16
    attention_tflops: float  # achieved by causal attention, forward and backward, counted as MFU counts it
    h2d_gbps: float  # pinned host memory to the device, per direction
    d2h_gbps: float
    host_gbps: float  # the host memory's streaming bandwidth at all cores (a triad's)
    device_gbps: float  # the device memory's
    sources: dict[str, str] = field(default_factory=dict)
    host_update_ns: float = 0.28  # L2L's host AdamW a parameter, every pass of it (LAMB: its bytes' share more)


def machine(kind: machines.Kind) -> Machine:
    """A machine kind of the catalogue (suite/measure/machines.py; with a lent machine's measured rates where the
    index gives them) as the roofline reads it, every rate's source kept."""
    r = kind.rates
    return Machine(
        kind.title,
        kind.gpu,
        gemm_tflops=kind.rate("gemm_tflops"),
        attention_tflops=kind.rate("attention_tflops"),
        h2d_gbps=kind.rate("h2d_gbps"),
        d2h_gbps=kind.rate("d2h_gbps"),
        host_gbps=kind.rate("host_gbps"),
        device_gbps=kind.rate("device_gbps"),
        host_update_ns=kind.rate("host_update_ns"),
        sources={
            "gemm": f"{r['gemm_tflops'].source}; attention {r['attention_tflops'].source}",
            "link": r["h2d_gbps"].source,
            "host": r["host_gbps"].source,
            "update": r["host_update_ns"].source,
            "device": r["device_gbps"].source,
        },
    )


# The lent kinds, and the prefix of their records' machine slugs
MACHINES = {name: machine(machines.kind(name)) for name in machines.LENT}
SLUGS = {name: machines.kind(name).slug for name in machines.LENT}


@dataclass
class Roofline:
    step_s: float
    tokens: int  # a step's
    compute_s: float
    h2d_s: float
    d2h_s: float
    host_s: float
    tail_s: float  # what cannot overlap the slowest (see project)
    bound: str  # the busiest of the resources the step overlaps: "compute", "upload", "download" or "host"
    flops: float  # the step's model FLOPs (MFU's), beside the hardware FLOPs compute_s is made of
    parameters: int
    h2d_bytes: int  # over PCIe a step, up
    d2h_bytes: int  # and down
    elementwise_s: float = 0.0  # of compute_s: the kernels that are not matmuls, at the device memory's rate
    host_ns_for_compute: float | None = None  # the host update a parameter at which the host takes compute's time

    @property
    def pcie_bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s


def layer_sizes(run) -> list[int]:
    """Parameters of each layer of the run's model (embeddings, blocks, head), built on `meta` once a shape."""
    import torch

    from suite.harness.model import build_model, shape_key

    shape = shape_key(run.model)
    if shape not in _SIZES:
        with torch.device("meta"):
            model = build_model(run.model, run.seed)
        _SIZES[shape] = [sum(p.numel() for _, p in model.layer_named_parameters(i)) for i in range(model.num_layers)]
    return _SIZES[shape]


_SIZES: dict[str, list[int]] = {}


def project(run, spec: Machine, sizes: list[int] | None = None, update: str | None = None) -> Roofline:
    """The step of `run` (a RunConfig of l2l, l2l-cmp, fsdp-offload or amp) on `spec`; L2L's update where `update`
    says (default: the run's own `update` option): on the host (its param server) or on the device (each layer's
    master and moments streamed up and back over the link, both directions overlapping compute)."""
    from suite.core import registry

    sizes = layer_sizes(run) if sizes is None else sizes
    n, blocks = sum(sizes), sizes[1:-1]
    cls = registry.get(run.method)
    opts = cls.resolved_options(run)
    samples, m = run.batch_size, run.model.resolved()
    flops = per_sample(run, cls.recomputes(run))
    # Attention's share of the hardware FLOPs (each block's 4 S^2 H a forward, three forwards' worth and a
    # recompute's), at its own rate; the rest are matmuls
    forwards = 4 if flops["hardware_flops_per_sample"] > flops["flops_per_sample"] else 3
    attention = samples * m.layers * 4 * run.seq_len**2 * m.hidden * forwards
    matmuls = samples * flops["hardware_flops_per_sample"] - attention + samples * head_recompute_flops(run)
    w = WIRE[run.precision]
    l2l = run.method in ("l2l", "l2l-cmp")
    update = update or (opts.get("update", "host") if l2l else "host")
    if update not in UPDATES or (update == "device" and not updates_on_device(run)):
        raise ValueError(
            f"update={update!r}: one of {list(UPDATES)}, and 'device' for L2L with AdamW, no gate and one rank only"
        )
    moved = samples * run.seq_len * elementwise_bytes(run, forwards) + sum_bytes(run, n, l2l)
    if update == "device":
        moved += n * (HOST_UPDATE["adamw"] + STATE)  # AdamW in device memory, its state arriving and leaving there
    elementwise = moved / (spec.device_gbps * 1e9)
    compute = matmuls / (spec.gemm_tflops * 1e12) + attention / (spec.attention_tflops * 1e12) + elementwise
    h2d_bps, d2h_bps, host_bps = spec.h2d_gbps * 1e9, spec.d2h_gbps * 1e9, spec.host_gbps * 1e9
    host_ns_for_compute = None
    if l2l:
        if opts["overlap"] != "on":
            raise ValueError(f"{run.method}: the roofline models overlap=on (the host updates during the backward)")
        slots = opts["block_slots"]
        again = sum(blocks[: max(len(blocks) - slots, 0)])  # blocks below the top slots: uploaded again
        stash = samples * run.seq_len * m.hidden * w * len(blocks) if opts["stash"] == "cpu" else 0
        if update == "device":
            # each layer's master and moments up after its backward and back after its update, with the 16-bit
            # copy the next forward loads; its gradient never leaves the device, and the host only serves copies
            copy = n * w if run.precision != "fp32" else 0  # L2L's wire is its FP32 master, already counted
            up, down = (n + again) * w + n * STATE + stash, n * STATE + copy + stash
            per_param = 0.0
        else:
            up, down = (n + again) * w + stash, n * w + stash
            # the update a parameter at its rate (AdamW's; LAMB's in proportion to the bytes it streams)
            per_param = spec.host_update_ns * 1e-9 * HOST_UPDATE[run.optimizer] / HOST_UPDATE["adamw"]
        copies = (up + down) / host_bps  # the copy engines reading and writing host memory
        host = n * per_param + copies
        busy = {"compute": compute, "upload": up / h2d_bps, "download": down / d2h_bps, "host": host}
        overlapped = dict(busy)
        if run.precision == "fp16" or run.clip_grad_norm > 0:
            # A gated step (fp16's overflow, clipping's norm): no layer commits before the backward has ended, so the
            # commits (and, clipped on the device, the gradients' downloads) overlap only the next forward, which
            # follows them layer by layer: the backward, then the slower of the forward and what the host does.
            forward = compute / forwards
            after = max(host, down / d2h_bps if run.clip_grad_norm > 0 else 0.0)
            overlapped["host"] = compute - forward + max(forward, after)
            tail = sizes[0] * w / h2d_bps  # the first upload
            keep_up = forward - copies
        elif update == "device":
            tail = sizes[0] * STATE / d2h_bps  # the embeddings' state down after their update, the last
            keep_up = None
        else:
            first = sizes[0] + sizes[1]  # the embeddings and first block land last; the next forward needs them first
            # after the backward, in series: the embeddings' gradient down, the two layers' updates, the first upload
            tail = sizes[0] * w / d2h_bps + first * per_param + sizes[0] * w / h2d_bps
            keep_up = compute - copies
        step = max(overlapped.values()) + tail
        if keep_up is not None and update == "host":
            host_ns_for_compute = max(keep_up, 0.0) / n * 1e9 * HOST_UPDATE["adamw"] / HOST_UPDATE[run.optimizer]
    elif run.method == "fsdp-offload":
        gathers = 2 * run.num_micro_batches if opts["reshard"] == "on" else run.num_micro_batches
        up, down = gathers * n * 4, n * 4  # FP32 shards up at every gather, FP32 gradients down once
        host = (n * HOST_UPDATE["adamw"] + up + down) / host_bps
        busy = {"compute": compute, "upload": up / h2d_bps, "download": down / d2h_bps, "host": host}
        tail = n * HOST_UPDATE["adamw"] / host_bps  # the optimizer after the backward, in series
        overlapped = {k: busy[k] for k in ("compute", "upload", "download")}
        step = max(overlapped.values()) + tail
    elif run.method in ("amp", "ag"):
        tail = n * DEVICE_UPDATE / (spec.device_gbps * 1e9)
        up = down = 0
        busy = {"compute": compute, "upload": 0.0, "download": 0.0, "host": 0.0}
        overlapped = {"compute": compute}
        step = compute + tail
    else:
        raise ValueError(f"no roofline for method {run.method!r}: one of l2l, l2l-cmp, fsdp-offload, amp, ag")
    return Roofline(
        step_s=step,
        tokens=samples * run.seq_len,
        compute_s=busy["compute"],
        h2d_s=busy["upload"],
        d2h_s=busy["download"],
        host_s=busy["host"],
        tail_s=tail,
        bound=max(overlapped, key=overlapped.get),  # the slowest of what the step overlaps
        flops=samples * flops["flops_per_sample"],
        parameters=n,
        h2d_bytes=up,
        d2h_bytes=down,
        elementwise_s=elementwise,
        host_ns_for_compute=host_ns_for_compute,
    )


# Bytes a token moves through device memory in a block's kernels that are not matmuls, per forward (their inputs
# read, outputs written, at the compute precision): two RMSNorms (2 H each), RoPE on the queries and keys (2 (H + K)),
# SwiGLU's activation (gate and up read, their product written: 3 I), two residual adds (3 H each); a backward moves
# about twice a forward's. A floor: eager kernels reach part of the memory's rate, and casts are left out.
def elementwise_bytes(run, forwards: int) -> float:
    """Bytes a token moves in the step's non-matmul kernels: every block's (see above) over `forwards` forwards'
    worth (3, 4 with recompute), and the head's cross-entropy over its logits (FP32: read, and the gradient written,
    in the forward and backward; the logits made again where the loss is chunked)."""
    m = run.model.resolved()
    w = WIRE[run.precision]
    kv = m.kv_heads * (m.hidden // m.heads) if m.kv_heads else m.hidden
    block = (12 * m.hidden + 2 * kv + 3 * m.intermediate) * w * forwards
    chunked = chunk_for(run.seq_len * run.micro_batch_size, m.vocab_size, m.loss_chunk) if m.family == "llama" else 0
    head = m.vocab_size * 4 * (3 + (1 if chunked else 0))
    return m.layers * block + head


def updates_on_device(run) -> bool:
    """Whether L2L can run `run` with update=device: its own check_config says (AdamW, overlap on, no gate, ...)."""
    import dataclasses

    from suite.config.errors import ConfigError
    from suite.core import registry

    if run.method not in ("l2l", "l2l-cmp"):
        return False
    try:
        registry.get(run.method).check_config(dataclasses.replace(run, options={**run.options, "update": "device"}))
    except ConfigError:
        return False
    return True


def sum_bytes(run, n: int, l2l: bool) -> float:
    """Bytes a step moves through device memory summing its micro-batches' parameter gradients: L2L's 16-bit slots
    read each micro-batch's gradient (2) and add it into an FP32 sum (8), which is rounded once a step (4 + 2);
    elsewhere (and L2L in FP32) autograd adds each micro-batch's FP32 gradient into the last (12)."""
    if l2l and run.precision != "fp32":
        return run.num_micro_batches * n * 10 + n * 6
    return run.num_micro_batches * n * 12


def head_recompute_flops(run) -> float:
    """FLOPs a sample's LM head spends again where its loss is made a chunk of tokens at a time (the chunks' logits
    are made again in the backward: chunked_lm_loss checkpoints them): one more forward of the head's matmul."""
    m = run.model.resolved()
    if m.family != "llama" or not chunk_for(run.seq_len * run.micro_batch_size, m.vocab_size, m.loss_chunk):
        return 0.0
    return 2 * run.seq_len * m.hidden * m.vocab_size
