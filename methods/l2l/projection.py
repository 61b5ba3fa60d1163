"""L2L's step projected on any GPU and host: the relay's schedule replayed with stated costs, nothing trained.

A step is replayed on four resources as methods/l2l/method.py and updates.py issue it: the device's compute
stream, its host-to-device and device-to-host copy engines (each first in, first out), and the one host thread
that prepares and commits each layer's update (the lowest landed layer first). Each layer's forward runs its u
micro-batches at once; its backward recomputes them first (3x the forward's FLOPs in all); the two block slots
alternate, so an upload into a slot waits for the compute that last read it, and a slot's next gradient waits
for the download of the one before. The host's updates start when their gradient lands (overlap on, ungated),
once every layer's overflow flag and norm is in (overlap on, behind the fp16 or clipping gate), or after the
whole backward with the device's host thread waiting (overlap off, the paper's Algorithm 2); an upload waits
for its layer's commit of the step before. Between steps the measurement synchronises the device, as the suite's
timed steps do. Several steps are replayed and the last one's span is the step time (the steady state).

Costs, each stated where it is used (DEVICES; and the row's reference beside each projected figure):
- compute: a block's FLOPs per sample (suite.measure.flops.block_flops) at the device's achieved rate for the
  precision (an assumption or this suite's measurement, named in the spec); embeddings and a classification
  head are taken as free (their FLOPs are under 1% of a block's);
- copies: bytes over the link's effective bandwidth per direction, the weights at the wire's precision;
- host: the update's ns per parameter (preparing: widening, unscaling and norms; committing: the optimizer and
  the 16-bit copy), at the host's thread count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from suite.measure import machines
from suite.measure.flops import block_flops

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU, its link to the host and the host's update speed, each figure with where it comes from."""

    name: str
    tflops: dict[str, float]  # achieved at the relay's micro-batches, by precision
    h2d_gbps: float  # effective, pinned host memory, per direction
    d2h_gbps: float
    prepare_ns: float  # host ns per parameter: widen, unscale, norms
    commit_ns: dict[str, float]  # host ns per parameter of the update (with the 16-bit copy under CMP), by host_optim
    sources: dict[str, str] = field(default_factory=dict)
    # Several GPUs on one host (the paper's 4-GPU rows): the host sums each further GPU's gradients into the first's
    # before the update, reading the incoming gradient at the wire's precision and the FP32 sum and writing it back,
    # at this effective host memory bandwidth.
    reduce_gbps: float = 40.0


# The H100 of this suite's records; the A100 and GH200 below are it with another GPU or link.
H100 = DeviceSpec(
    "H100 80GB HBM3 SXM, PCIe Gen5 x16 (h100-79gb)",
    tflops={"fp16": 130.0, "bf16": 130.0, "fp32": 40.0},
    h2d_gbps=machines.kind("h100").rate("h2d_gbps"),
    d2h_gbps=machines.kind("h100").rate("d2h_gbps"),
    prepare_ns=0.5,
    commit_ns={"foreach": 2.5, "fused": 0.5},
    sources={
        "tflops": "measured, this harness (h100-79gb, 2026-11-23): fp16 (and bf16, taken equal) from Table 3's "
        "AMP recomputing per layer (0.66 s per micro-batch of 64 x 512, recompute counted: 130 TFLOPS); fp32 "
        "assumed 60% of the 66.9 TFLOPS FP32 peak (the FP32 baseline at micro-batch 2 reached 32%)",
        "link": machines.kind("h100").rates["h2d_gbps"].source,
        "host": "assumed: foreach LAMB 2.5 ns/param on its 16 cores (not measured there: the records predate "
        "the host benchmark, which the next campaign runs); fused 0.5 (cpu-epyc's 0.79 at 2 threads, taken "
        "faster on 16); prepare 0.5",
    },
)

# The devices a projection knows. "Assumed" figures are round numbers with their reason; the rest are measured
# or published. The host's commit ns/param: `foreach` is the suite's LAMB before #29 (the kernel of the
# h100-79gb records), `fused` the suite's fused LAMB (results/bench-host-optim.md), `paper` the L2L paper's
# host optimizer (PyTorch LAMB on a 2019-20 server, per-tensor ops).
DEVICES = {
    "v100": DeviceSpec(
        "V100-16GB, PCIe Gen3 x16 (the L2L paper's machine)",
        tflops={"fp16": 36.0, "fp32": 12.0},
        h2d_gbps=machines.kind("v100").rate("h2d_gbps"),
        d2h_gbps=machines.kind("v100").rate("d2h_gbps"),
        prepare_ns=1.0,
        commit_ns={"paper": 5.0, "foreach": 3.0, "fused": 1.0},
        reduce_gbps=25.0,
        sources={
            "tflops": "assumed: fp16 29% of the V100's 125 TFLOPS tensor peak (BERT-Large kernels of 2019-20, "
            "micro-batch 64 x 512), fp32 76% of its 15.7 TFLOPS",
            "link": machines.kind("v100").rates["h2d_gbps"].source,
            "host": "assumed: 5 ns/param for the paper's per-tensor PyTorch LAMB (the suite's foreach LAMB, "
            "3.0-3.8 ns/param on cpu-epyc, taken 1.5x slower on a 2019 host); prepare 1 ns/param; several GPUs' "
            "gradients summed on the host at 25 GB/s (a 2019 server's tensor add; the triad on cpu-epyc: 33-45 GB/s)",
        },
    ),
    "h100": H100,
    "a100": dataclasses.replace(
        H100,
        name="A100 80GB SXM, PCIe Gen4 x16",
        tflops={"fp16": 130.0 * 312 / 989, "bf16": 130.0 * 312 / 989, "fp32": 0.6 * 19.5},
        h2d_gbps=machines.kind("a100").rate("h2d_gbps"),
        d2h_gbps=machines.kind("a100").rate("d2h_gbps"),
        sources={
            "tflops": "projected: the H100's measured fp16 utilisation (13%) of the A100's 312 TFLOPS; fp32 60% "
            "of 19.5",
            "link": machines.kind("a100").rates["h2d_gbps"].source,
            "host": "assumed: the H100 host's figures",
        },
    ),
    "h200": dataclasses.replace(
        H100,
        name="H200 141GB HBM3e SXM, PCIe Gen5 x16",
        sources={
            "tflops": "projected: the H100's measured rates (the same compute; its faster HBM3e not credited)",
            "link": machines.kind("h200").rates["h2d_gbps"].source,
            "host": "assumed: the H100 host's figures (the lent H200's host has 16 cores too)",
        },
    ),
    "gh200": dataclasses.replace(
        H100,
        name="GH200 (H100 96GB + Grace, NVLink-C2C)",
        h2d_gbps=machines.kind("gh200").rate("h2d_gbps"),
        d2h_gbps=machines.kind("gh200").rate("d2h_gbps"),
        sources={
            "tflops": "projected: the H100's measured rates (same GPU)",
            "link": machines.kind("gh200").rates["h2d_gbps"].source,
            "host": "assumed: the H100 host's figures (Grace's 72 cores and LPDDR5X would be faster: not measured)",
        },
    ),
}


@dataclass(frozen=True)
class Relay:
    """What one L2L step moves and computes: per layer (embeddings, blocks, head) its parameters and forward
    seconds per micro-batch, and what the run chose."""

    params: list[int]
    forward_s: list[float]  # one micro-batch's forward of each layer
    stash_bytes: float  # one micro-batch's block input, at the compute precision
    wire_bytes: int  # per parameter, each way
    u: int  # micro-batches through each layer (the inner loop)
    samples: int  # per step: u micro-batches
    stash: str  # "gpu" or "cpu"
    overlap: bool
    gated: bool  # fp16 loss scaling or clipping: commits wait for every layer's verdict
    prepare_s: list[float]
    commit_s: list[float]
    h2d: float  # bytes/s
    d2h: float


def relay_of(run, spec: DeviceSpec, host_optim: str = "fused", gpus: int = 1) -> Relay:
    """The Relay of an L2L run (a RunConfig of `l2l` or `l2l-cmp`) on `spec`, one of `gpus` sharing its host (the
    host then sums their gradients as each layer's land, before preparing its update)."""
    m = run.model.resolved()
    b, s, h = run.micro_batch_size, run.seq_len, m.hidden
    i = m.intermediate
    block = 4 * h * h + 2 * h * i + 9 * h + i  # attention (q, k, v, out), feed-forward, two LayerNorms, biases
    embed = (m.vocab_size + m.max_seq + 2) * h + 2 * h  # words, positions, two token types, LayerNorm
    head = h * h + h + (h + 1) * max(m.num_labels, 1)  # pooler and classifier
    params = [embed, *[block] * m.layers, head]
    rate = spec.tflops[run.precision] * 1e12
    forward = [0.0, *[b * block_flops(s, h, i) / rate] * m.layers, 0.0]
    nbytes = BYTES[run.precision]
    opts = {"stash": "gpu", "overlap": "off", **run.options}
    reduce_ns = (
        (gpus - 1) * (nbytes + 8) / spec.reduce_gbps
    )  # ns per parameter: the gradient read, the sum read, written
    return Relay(
        params=params,
        forward_s=forward,
        stash_bytes=b * s * h * nbytes,
        wire_bytes=nbytes,
        u=run.num_micro_batches,
        samples=run.batch_size,
        stash=opts["stash"],
        overlap=opts["overlap"] == "on",
        gated=run.precision == "fp16" or run.clip_grad_norm > 0,
        prepare_s=[p * (spec.prepare_ns + reduce_ns) * 1e-9 for p in params],
        commit_s=[p * spec.commit_ns[host_optim] * 1e-9 for p in params],
        h2d=spec.h2d_gbps * 1e9,
        d2h=spec.d2h_gbps * 1e9,
    )


@dataclass
class Projection:
    step_s: float
    samples: int
    busy: float  # the device's compute share of the step
    compute_s: float  # per step: the device's compute,
    h2d_s: float  # its uploads (weights and stash),
    d2h_s: float  # its downloads (gradients and stash),
    host_s: float  # and the host thread's updates
    bound: str  # the resource busiest over the step: "compute", "upload", "download" or "host"

    @property
    def throughput(self) -> float:
        return self.samples / self.step_s


def project(r: Relay, steps: int = 4) -> Projection:
    """Replay `steps` steps of the relay; the last one's span is the step time."""
    n, head = len(r.params), len(r.params) - 1
    f = r.forward_s
    commit_end = [0.0] * n  # when each layer's latest commit ends
    start, step = 0.0, 0.0

    def slot(layer):
        return "embed" if layer == 0 else "head" if layer == head else layer % 2

    for _ in range(steps):
        t = {"dev": start, "h2d": start, "d2h": start}
        read, shipped, down, up, loaded = {}, {}, {}, {}, {}

        def upload(layer, issued):  # into the layer's slot, once the compute reading it has finished
            t["h2d"] = max(issued, t["h2d"], read.get(slot(layer), start)) + r.params[layer] * r.wire_bytes / r.h2d
            loaded[layer] = t["h2d"]

        def compute(layer, ready, seconds, backward):  # a backward first waits for the slot's last gradient copy
            t["dev"] = max(t["dev"], ready, shipped.get(slot(layer), start) if backward else start) + seconds
            read[slot(layer)] = t["dev"]
            return t["dev"]

        # Forward: every micro-batch through a layer; the next layer uploads once its last commit has landed (a
        # prefetch that finds it unfinished leaves the upload to the layer's use, where the host thread waits).
        main = max(start, commit_end[0])
        upload(0, main)
        for layer in range(head):
            nxt = layer + 1
            if commit_end[nxt] <= main:
                upload(nxt, main)
            end = compute(layer, loaded[layer], r.u * f[layer], False)
            if r.stash == "cpu" and nxt < head:  # each micro-batch's output goes down as it is made
                for k in range(r.u):
                    t["d2h"] = max(t["d2h"], end - (r.u - 1 - k) * f[layer]) + r.stash_bytes / r.d2h
                down[nxt] = t["d2h"]
            if nxt not in loaded:
                main = max(main, commit_end[nxt])
                upload(nxt, main)
        # The head's forward and backward at once, then the blocks down to the embeddings, each recomputed from its
        # stash (brought back one layer ahead); the two blocks the forward left in the slots need no upload.
        in_slot = {head, head - 1, head - 2}
        landed = [0.0] * n
        for layer in range(head, -1, -1):
            below = layer - 1
            if below >= 0 and below not in in_slot:
                upload(below, start)  # this step's weights: nothing to wait for on the host
            if r.stash == "cpu" and 1 <= below < head:
                t["h2d"] = max(t["h2d"], down[below]) + r.u * r.stash_bytes / r.h2d
                up[below] = t["h2d"]
            end = compute(layer, max(loaded[layer], up.get(layer, start)), r.u * 3 * f[layer], True)
            t["d2h"] = max(t["d2h"], end) + r.params[layer] * r.wire_bytes / r.d2h
            landed[layer] = shipped[slot(layer)] = t["d2h"]
        device_end = max(t.values())
        # The host thread: prepare and commit every layer, after the backward (off), behind the verdict (gated),
        # or as gradients land, the lowest landed first (ungated).
        host = max(commit_end)
        if not r.overlap:  # Algorithm 2: prepare 0..n-1 (the first waits for the last gradient), then commit
            host = max(host, max(landed)) + sum(r.prepare_s)
            for layer in range(n):
                host += r.commit_s[layer]
                commit_end[layer] = host
            main = host  # the device's host thread waits for it all
        elif r.gated:
            for layer in sorted(range(n), key=lambda i: landed[i]):
                host = max(host, landed[layer]) + r.prepare_s[layer]
            main = max(t["dev"], host)  # the verdict, then the loss read
            for layer in range(n):  # in the order the next forward needs them
                host += r.commit_s[layer]
                commit_end[layer] = host
        else:
            todo = set(range(n))
            while todo:
                ready = [i for i in todo if landed[i] <= host]
                layer = min(ready) if ready else min(todo, key=lambda i: landed[i])
                host = max(host, landed[layer]) + r.prepare_s[layer] + r.commit_s[layer]
                commit_end[layer] = host
                todo.remove(layer)
            main = t["dev"]  # the loss read
        nxt_start = max(main, device_end)  # the measurement synchronises the device between steps
        step, start = nxt_start - start, nxt_start
    compute_s = 4 * r.u * sum(f)
    weights = sum(r.params) * r.wire_bytes
    stash = (head - 1) * r.u * r.stash_bytes if r.stash == "cpu" else 0.0
    h2d_s = (2 * weights - sum(r.params[head - 2 : head + 1]) * r.wire_bytes + stash) / r.h2d
    d2h_s = (weights + stash) / r.d2h
    host_s = sum(r.prepare_s) + sum(r.commit_s)
    busiest = {"compute": compute_s, "upload": h2d_s, "download": d2h_s, "host": host_s}
    return Projection(step, r.samples, compute_s / step, compute_s, h2d_s, d2h_s, host_s, max(busiest, key=busiest.get))


def ran(rec: dict, run) -> bool:
    """Whether a record ran what the row projects: its table's own run (not a `--set` variant of the row) with the
    same precision, batch, micro-batches, depth, stash and overlap."""
    from suite.core import registry

    if rec.get("variant"):
        return False
    r = (rec.get("config") or {}).get("run") or {}
    declared = registry.get(run.method).options

    def setting(options: dict, k: str):
        return options.get(k, declared[k].default)

    return (
        r.get("method") == run.method
        and r.get("precision") == run.precision
        and (r.get("micro_batch_size"), r.get("num_micro_batches")) == (run.micro_batch_size, run.num_micro_batches)
        and (r.get("model") or {}).get("layers") == run.model.resolved().layers
        and all(setting(r.get("options") or {}, k) == setting(run.options, k) for k in ("stash", "overlap"))
    )


def outside(value: float, spread: tuple[float, float]) -> float:
    """How far `value` lies outside [low, high], relative to the end it passes; 0 inside."""
    low, high = spread
    return (value - high) / high if value > high else (value - low) / low if value < low else 0.0
