"""Planner projections at the 2BW paper's scale: the `projected` cell kind (no training, the cost model only)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from methods.pipeline.planner.costmodel import DEVICE_SPECS, analytic_profile
from methods.pipeline.planner.costs import DeviceSpec, Profile
from methods.pipeline.planner.predict import SCHEDULES, predict, stage_memory, stages_of
from methods.pipeline.planner.profiling import cached_profile
from suite.config.sizes import parse_size

# Micro-batch sizes the planner may choose from when a row asks for the fastest fitting one.
MICRO_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


class ProjectedOOM(torch.OutOfMemoryError):
    """A projected configuration whose worst stage exceeds the memory cap; keeps the prediction as metrics."""

    def __init__(self, message: str, metrics: dict):
        super().__init__(message)
        self.metrics = metrics


def placed_links(profile: Profile, spec: DeviceSpec, d: int, w: int) -> Profile:
    """Links by placement: pipelines are packed server by server, so a stage's p2p crosses servers once
    d > per_server, and its replicas' all-reduce crosses servers once d * w > per_server."""
    return dataclasses.replace(
        profile,
        p2p=spec.intra if d <= spec.per_server else spec.inter,
        all_reduce=spec.intra if d * w <= spec.per_server else spec.inter,
    )


def paper_profile(run, spec: DeviceSpec, d: int, w: int, layers: int | None = None) -> Profile:
    """The run's model dims (GPT, mixed precision) on `spec`, with links placed for d x w workers."""
    mc = run.model
    prof = analytic_profile(layers or mc.layers, mc.hidden, mc.heads, run.seq_len, mc.vocab_size, spec)
    return placed_links(prof, spec, d, w)


def extended_profile(prof: Profile, blocks: int) -> Profile:
    """A measured profile of embed + blocks + head with its middle block repeated to `blocks` blocks."""
    embed, *middle, head = prof.layers
    block = middle[len(middle) // 2]
    return dataclasses.replace(
        prof, layers=[embed, *[dataclasses.replace(block, name=f"block{i + 1}") for i in range(blocks)], head]
    )


def params_of(prof: Profile) -> int:
    return sum(c.params for c in prof.layers)


def fastest_fitting(prof: Profile, method: str, d: int, w: int, batch: int, recompute: bool, cap: float | None):
    """The planner's pick for a fixed (method, d, w, global batch): the fastest fitting micro-batch size
    (the paper: "the largest per-GPU microbatch size that fits"); None when none fits."""
    best = None
    for b in MICRO_BATCH_SIZES:
        if batch % (b * w):
            continue
        m = batch // (b * w)
        if SCHEDULES[method] in ("1f1b", "2bw") and m < d:
            continue
        p = predict(prof, method, d, w, b, m, recompute, cap)
        if p.fits and (best is None or p.throughput > best.throughput):
            best = p
    return best


def max_layers(
    make_profile, method: str, d: int, w: int, b: int, m: int, recompute: bool, cap: float, limit: int = 4096
) -> int:
    """The most blocks (>= d - 2 so every stage has a layer) whose worst stage fits under `cap`; 0 if none.
    Memory grows with the block count, so a doubling then a bisection finds it."""

    def fits(n):  # memory only: the time simulation is what costs at d=64
        prof = make_profile(n)
        return max(stage_memory(prof, stages_of(prof, d), method, b, m, recompute, w)) <= cap

    lo = max(d - 2, 1)
    if not fits(lo):
        return 0
    hi = lo
    while hi < limit and fits(hi * 2):
        hi *= 2
    lo, hi = hi, min(hi * 2, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _metrics(p, prof: Profile) -> dict:
    return {
        "throughput": p.throughput,
        "step_time": p.step_time,
        "memory_worst_rank_gb": p.memory / 1e9,
        "memory_gb": p.memory / 1e9,
        "stage_memory": p.stage_memory,
        "bubble": p.bubble,
        "b": p.b,
        "m": p.m,
        "global_batch": p.global_batch,
        "fits": p.fits,
        "params_billion": params_of(prof) / 1e9,
        "profile_source": prof.source,
        "p2p_link": vars(prof.p2p),
        "all_reduce_link": vars(prof.all_reduce),
    }


def project(run, cap: int | None = None, timed: bool = True) -> dict:
    """The planner's metrics for the configuration a projected cell carries in run.options["projection"]:

    - spec: a DEVICE_SPECS name (analytic GPT profile from the run's model dims) or "measured" (this
      machine's cached per-layer profile of the run's model, blocks repeated to model.layers);
    - method: a planner schedule name (the methods' names, or "mp" for inter-layer model parallelism);
    - micro_batch: "fastest" (the planner picks b for the global batch micro_batch_size x num_micro_batches)
      or "fixed" (b = micro_batch_size, m = num_micro_batches / width);
    - search: "max_layers" reports the most blocks whose worst stage fits instead.
    d and w are the run's stages and width, recompute its option; the cap is the spec's memory or --device-memory.
    """
    from suite.config.paths import RESULTS_DIR
    from suite.core import registry

    spec_p = run.options.get("projection") or {}
    method = spec_p.get("method", run.method)
    if method not in SCHEDULES:
        raise ValueError(f"projection method {method!r} is not one the planner knows: {sorted(SCHEDULES)}")
    o = registry.get(run.method).resolved_options(run)
    d, w, rc = o["stages"], o["width"], o["recompute"]
    name = spec_p.get("spec", "v100")
    if name == "measured":
        base = dataclasses.replace(run, model=dataclasses.replace(run.model, layers=spec_p.get("profiled_layers", 4)))
        # untimed: its bytes alone, for a memory search whose times no one reads (fig9_2bw.predicted_max)
        measured = cached_profile(base, Path(RESULTS_DIR) / ".cache" / "profiles", threads=1, timed=timed)
        make = lambda n: extended_profile(measured, n)  # noqa: E731
        cap = cap if cap is not None else (parse_size(run.device_memory) if run.device_memory else None)
    elif name in DEVICE_SPECS:
        spec = DEVICE_SPECS[name]
        make = lambda n: paper_profile(run, spec, d, w, n)  # noqa: E731
        cap = cap if cap is not None else spec.memory
    else:
        raise ValueError(f"projection spec {name!r} is not 'measured' or one of {sorted(DEVICE_SPECS)}")
    if spec_p.get("search") == "max_layers":
        if cap is None:
            raise ValueError("a max_layers search needs a memory cap (the spec's, or --device-memory)")
        b, m = run.micro_batch_size, run.num_micro_batches // w
        n = max_layers(make, method, d, w, b, m, rc, cap)
        if n == 0:
            raise ProjectedOOM(f"no model fits {cap} bytes at d={d}", {"max_layers": 0})
        prof = make(n)
        return {
            **_metrics(predict(prof, method, d, w, b, m, rc, cap), prof),
            "max_layers": n,
            "max_params_billion": params_of(prof) / 1e9,
            "cap_gb": cap / 1e9,
        }
    prof = make(run.model.layers)
    if spec_p.get("micro_batch", "fixed") == "fastest":
        p = fastest_fitting(prof, method, d, w, run.batch_size, rc, cap)
        if p is None:
            raise ProjectedOOM(
                f"no micro-batch size of {method} at d={d}, w={w}, batch {run.batch_size} fits {cap / 1e9:.3g} GB",
                {"params_billion": params_of(prof) / 1e9},
            )
    else:
        p = predict(prof, method, d, w, run.micro_batch_size, run.num_micro_batches // w, rc, cap)
    metrics = {**_metrics(p, prof), "cap_gb": (cap or 0) / 1e9}
    if not p.fits:  # like a device that runs out: the status says oom, the predicted memory is kept
        metrics.pop("throughput")
        raise ProjectedOOM(
            f"projected {p.memory / 1e9:.3g} GB on the worst stage exceeds the {cap / 1e9:.3g} GB cap", metrics
        )
    return metrics


def projected_cell(run, device, cap) -> dict:
    """Predict the configuration with the planner's cost model; nothing is trained."""
    return project(run, cap)
