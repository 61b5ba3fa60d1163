"""The PipeDream-2BW planner (paper §4): predict time and memory of (w, d, b, recompute) configurations, rank them."""

from __future__ import annotations

from dataclasses import dataclass, field

from methods.pipeline.planner.costs import Profile
from methods.pipeline.schedules.partition import partition
from methods.pipeline.schedules.schedule import GENERATORS
from methods.pipeline.schedules.simulate import Costs, simulate
from methods.pipeline.schedules.validate import stash_bound, version_bound

# Schedules the planner knows: the method's schedule name, and "mp" for inter-layer model parallelism
# (one micro-batch in the pipeline at a time; the paper's Figure 6/7 baseline).
SCHEDULES = {"gpipe": "gpipe", "pipedream-flush": "1f1b", "pipedream-2bw": "2bw", "mp": "mp"}


@dataclass
class Prediction:
    """One configuration's predicted step time, throughput and per-stage memory."""

    method: str
    w: int
    d: int
    b: int
    m: int
    recompute: bool
    step_time: float
    stage_memory: list[float]
    bubble: float
    stages: list[range] = field(default_factory=list)
    memory_cap: float | None = None

    @property
    def global_batch(self) -> int:
        return self.b * self.m * self.w

    @property
    def throughput(self) -> float:
        return self.global_batch / self.step_time if self.step_time else 0.0

    @property
    def memory(self) -> float:
        """Worst-case bytes over the stages: what must fit on every device."""
        return max(self.stage_memory)

    @property
    def fits(self) -> bool:
        return self.memory_cap is None or self.memory <= self.memory_cap

    def as_dict(self) -> dict:
        return {
            "method": self.method,
            "w": self.w,
            "d": self.d,
            "b": self.b,
            "m": self.m,
            "recompute": self.recompute,
            "global_batch": self.global_batch,
            "step_time": self.step_time,
            "throughput": self.throughput,
            "memory": self.memory,
            "stage_memory": self.stage_memory,
            "bubble": self.bubble,
            "fits": self.fits,
        }


def stages_of(profile: Profile, d: int) -> list[range]:
    """The method's own split (methods.pipeline.method.split_layers): contiguous, balanced by parameters."""
    return partition([c.params for c in profile.layers], d)


def stage_costs(profile: Profile, stages: list[range], b: int, w: int, recompute: bool) -> list[Costs]:
    """Per-stage action costs at micro-batch size b: compute from the fitted lines, sends from the boundary
    activation's bytes, the all-reduce (ring: 2(w-1)/w of the gradient bytes) and the optimizer step."""
    out = []
    for r in stages:
        layers = [profile.layers[i] for i in r]
        fwd = sum(c.fwd(b) for c in layers)
        bwd = sum(c.bwd(b) for c in layers) + (fwd if recompute else 0.0)
        boundary = max(layers[-1].out_bytes, profile.layers[r.start - 1].out_bytes if r.start else 0.0) * b
        params = sum(c.params for c in layers)
        grads = 4 * params
        ring = profile.all_reduce.seconds(2 * (w - 1) / w * grads) if w > 1 else 0.0
        out.append(
            Costs(
                forward=fwd,
                backward=bwd,
                send=profile.p2p.seconds(boundary),
                optimizer=profile.optimizer_s_per_param * params,
                all_reduce=ring,
            )
        )
    return out


def stage_memory(
    profile: Profile, stages: list[range], method: str, b: int, m: int, recompute: bool, w: int = 1
) -> list[float]:
    """Worst-case bytes per stage: weight versions + gradient + optimizer state, plus the larger of two phases.

    Compute: the activation stash of the in-flight micro-batches (their inputs only under recompute, plus one
    micro-batch rebuilt) and the backward's transient. Update: the flat gradient buffer of the replicas'
    all-reduce (w > 1) and one layer's optimizer temporaries, beside the stash 2BW still holds (it updates
    with d - s - 1 micro-batches in flight; flush schedules update with an empty pipeline)."""
    sched = SCHEDULES[method]
    d = len(stages)
    versions = 1 if sched == "mp" else version_bound(sched)
    out = []
    for s, r in enumerate(stages):
        layers = [profile.layers[i] for i in r]
        params = sum(c.params for c in layers)
        static = params * (versions * profile.weight_bytes_per_param + profile.state_bytes_per_param)
        inflight = 1 if sched == "mp" else min(stash_bound(sched, d, m, 1, s), m)
        inp = profile.layers[r.start - 1].out_bytes * b if r.start else 0.0
        full = sum(c.keep_bytes for c in layers) * b
        per_mb = inp + (0.0 if recompute else full)
        stash = inflight * per_mb + (full if recompute else 0.0)
        work = max(c.work_bytes for c in layers) * b
        if profile.holds_sends and sched != "mp":  # sent activations (not last stage) and gradients (not first)
            boundary_out = layers[-1].out_bytes * b if s < d - 1 else 0.0
            work += m * (boundary_out + inp)
        held = (inflight - 1) * per_mb if sched == "2bw" else 0.0
        update = (
            held
            + (profile.all_reduce_buffer_bytes_per_param * params if w > 1 else 0.0)
            + profile.optimizer_temp_bytes_per_param * max(c.params for c in layers)
        )
        out.append(static + max(stash + work, update))
    return out


def step_time(method: str, costs: list[Costs], m: int) -> tuple[float, float]:
    """Steady-state seconds per optimizer step and the bubble fraction, from the schedule simulator.

    Flush schedules repeat one identical step; 2BW never drains, so its step is the difference of two
    streams one step apart; inter-layer model parallelism runs one micro-batch through all stages at a time.
    """
    sched = SCHEDULES[method]
    d = len(costs)
    if sched == "mp":
        tl = simulate(GENERATORS["gpipe"](d, 1, 1), [Costs(c.forward, c.backward, c.send) for c in costs])
        t = m * tl.makespan + max(c.optimizer + c.all_reduce for c in costs)
    elif sched == "2bw":
        short, long = simulate(GENERATORS["2bw"](d, m, 2), costs), simulate(GENERATORS["2bw"](d, m, 4), costs)
        t = (long.makespan - short.makespan) / 2
    else:
        t = simulate(GENERATORS[sched](d, m, 1), costs).makespan
    busy = sum(m * (c.forward + c.backward) for c in costs) / d  # useful compute per stage and step
    return t, (1.0 - busy / t if t else 0.0)


def predict(
    profile: Profile, method: str, d: int, w: int, b: int, m: int, recompute: bool, memory_cap: float | None = None
) -> Prediction:
    """Time and memory of `method` with d stages, w replicas, m micro-batches of b per replica per step."""
    if method not in SCHEDULES:
        raise ValueError(f"unknown method {method!r}; the planner knows {sorted(SCHEDULES)}")
    if not 1 <= d <= len(profile.layers):
        raise ValueError(f"d={d}: the profile has {len(profile.layers)} layers")
    stages = stages_of(profile, d)
    costs = stage_costs(profile, stages, b, w, recompute)
    t, bubble = step_time(method, costs, m)
    mem = stage_memory(profile, stages, method, b, m, recompute, w)
    cap = memory_cap if memory_cap is not None else profile.memory
    return Prediction(method, w, d, b, m, recompute, t, mem, bubble, stages, cap)


def configurations(workers: int, layers: int, max_batch: int, micro_batch_sizes, method: str):
    """(w, d, b, m) with w * d = workers, d <= layers and the largest m with b * m * w <= max_batch (m >= d for
    the 1F1B schedules, whose steady state needs d micro-batches in flight)."""
    for d in range(1, min(workers, layers) + 1):
        if workers % d:
            continue
        w = workers // d
        for b in micro_batch_sizes:
            m = max_batch // (b * w)
            if m < 1 or (SCHEDULES[method] in ("1f1b", "2bw") and m < d):
                continue
            yield w, d, b, m


def plan(
    profile: Profile,
    workers: int,
    max_batch: int,
    memory_cap: float | None = None,
    methods=("pipedream-2bw",),
    micro_batch_sizes=(1, 2, 4, 8, 16, 32, 64),
    recompute=(False, True),
):
    """Every configuration, predicted; ranked fitting-first, then by throughput (highest first)."""
    preds = [
        predict(profile, meth, d, w, b, m, rc, memory_cap)
        for meth in methods
        for w, d, b, m in configurations(workers, len(profile.layers), max_batch, micro_batch_sizes, meth)
        for rc in recompute
    ]
    return sorted(preds, key=lambda p: (not p.fits, -p.throughput))


def render(preds: list[Prediction], top: int | None = None, unit: float = 1e9) -> str:
    """Markdown table of ranked predictions; configurations that do not fit are marked."""
    lines = [
        "| rank | method | w | d | b | m | recompute | global batch | predicted samples/s | "
        "predicted memory (GB, worst stage) | bubble | fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(preds[:top] if top else preds, 1):
        lines.append(
            f"| {i} | {p.method} | {p.w} | {p.d} | {p.b} | {p.m} | {'on' if p.recompute else 'off'} | "
            f"{p.global_batch} | {p.throughput:.4g} | {p.memory / unit:.4g} | {p.bubble:.1%} | "
            f"{'yes' if p.fits else '**no: exceeds cap**'} |"
        )
    return "\n".join(lines)
