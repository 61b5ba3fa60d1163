"""Replay a schedule with unit or measured costs into a timeline; export as Chrome trace or PNG."""

from __future__ import annotations

import json
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple, Sequence

from methods.pipeline.schedules.schedule import (
    ALL_REDUCE,
    BACKWARD,
    COMPUTE,
    FORWARD,
    OPTIMIZER_STEP,
    RECVS,
    SENDS,
    TOKEN,
    Action,
    Kind,
    Schedule,
    message_key,
)
from methods.pipeline.schedules.validate import execution_order


@dataclass(frozen=True)
class Costs:
    """Duration of each kind of action on one stage. Receives cost nothing themselves: they end
    when the matching send has ended (or at once if it already has)."""

    forward: float = 1.0
    backward: float = 1.0
    send: float = 0.0
    optimizer: float = 0.0
    all_reduce: float = 0.0

    def of(self, kind: Kind) -> float:
        return {
            FORWARD: self.forward,
            BACKWARD: self.backward,
            OPTIMIZER_STEP: self.optimizer,
            ALL_REDUCE: self.all_reduce,
        }.get(kind, self.send if kind in SENDS else 0.0)


class Event(NamedTuple):
    action: Action
    start: float
    end: float


@dataclass
class Timeline:
    """Per-stage (action, start, end) events, simulated or measured, and metrics drawn from them."""

    name: str
    events: list[list[Event]]
    microbatch_size: int = 1
    d: int = field(init=False)

    def __post_init__(self) -> None:
        self.d = len(self.events)

    @property
    def makespan(self) -> float:
        ev = [e for evs in self.events for e in evs]
        return max(e.end for e in ev) - min(e.start for e in ev) if ev else 0.0

    @property
    def busy(self) -> list[float]:
        """Per stage: time spent in forward/backward (the only work counted as useful)."""
        return [sum(e.end - e.start for e in evs if e.action.kind in COMPUTE) for evs in self.events]

    @property
    def bubble(self) -> float:
        """Idle compute time / (d * makespan); integer costs give the exact rational as a float."""
        total = self.d * self.makespan
        return (total - sum(self.busy)) / total if total else 0.0

    @property
    def peak_stash(self) -> list[int]:
        peaks = []
        for evs in self.events:
            live = peak = 0
            for e in evs:
                live += (e.action.kind is FORWARD) - (e.action.kind is BACKWARD)
                peak = max(peak, live)
            peaks.append(peak)
        return peaks

    @property
    def n_microbatches(self) -> int:
        if not self.d:
            return 0
        return len({e.action.mb for e in self.events[0] if e.action.kind is FORWARD})

    @property
    def throughput(self) -> float:
        """Samples per time unit: micro-batches * micro-batch size / makespan."""
        return self.n_microbatches * self.microbatch_size / self.makespan if self.makespan else 0.0

    @classmethod
    def from_records(cls, records: Iterable[dict], microbatch_size: int = 1, name: str = "measured") -> "Timeline":
        """Build from executor records {stage, kind, mb, version, start, end} (optional peer).

        Times must share one clock across stages; they are shifted so the earliest start is 0.
        `kind` is a Kind value ("FORWARD") or its token ("F")."""
        by_token = {t: k for k, t in TOKEN.items()}
        recs = list(records)
        t0 = min((r["start"] for r in recs), default=0.0)
        d = 1 + max((int(r["stage"]) for r in recs), default=-1)
        events: list[list[Event]] = [[] for _ in range(d)]
        for r in recs:
            kind = by_token.get(r["kind"]) or Kind(r["kind"])
            a = Action(kind, int(r["stage"]), r.get("mb"), int(r.get("version") or 0), r.get("peer"))
            events[a.stage].append(Event(a, r["start"] - t0, r["end"] - t0))
        for evs in events:
            evs.sort(key=lambda e: (e.start, e.end))
        return cls(name, events, microbatch_size)


def simulate(schedule: Schedule, cost: Costs | Sequence[Costs] | None = None, microbatch_size: int = 1) -> Timeline:
    """Replay `schedule`: each stage runs its actions back to back; a receive ends no earlier
    than its matching send. `cost` is one Costs for all stages or one per stage (default: unit
    F=B=1, communication and optimizer free). Raises ScheduleError if the schedule deadlocks."""
    cost = Costs() if cost is None else cost
    costs = [cost] * schedule.d if isinstance(cost, Costs) else list(cost)
    if len(costs) != schedule.d:
        raise ValueError(f"got {len(costs)} per-stage Costs for {schedule.d} stages")
    clock = [0.0] * schedule.d
    arrivals: dict[tuple, deque] = defaultdict(deque)
    events: list[list[Event]] = [[] for _ in range(schedule.d)]
    # The dry-run order puts every send before its receive, so one pass fixes all times.
    for s, i in execution_order(schedule):
        a = schedule.actions[s][i]
        start = clock[s]
        if a.kind in RECVS:
            end = max(start, arrivals[message_key(a)].popleft())
        else:
            end = start + costs[s].of(a.kind)
            if a.kind in SENDS:
                arrivals[message_key(a)].append(end)
        events[s].append(Event(a, start, end))
        clock[s] = end
    return Timeline(schedule.name, events, microbatch_size)


def to_chrome_trace(timeline: Timeline, path, scale: float = 1e6) -> int:
    """Write Chrome trace JSON (chrome://tracing, Perfetto): pid 0, one tid per stage, one "X"
    event per action. Times are multiplied by `scale` (seconds -> us). Returns the event count."""
    out = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}}
        for s in range(timeline.d)
    ]
    for s, evs in enumerate(timeline.events):
        for e in evs:
            out.append(
                {
                    "name": e.action.token,
                    "cat": e.action.kind.value,
                    "ph": "X",
                    "pid": 0,
                    "tid": s,
                    "ts": e.start * scale,
                    "dur": (e.end - e.start) * scale,
                    "args": {"mb": e.action.mb, "version": e.action.version},
                }
            )
    with open(path, "w") as f:
        meta = {"schedule": timeline.name, "makespan": timeline.makespan, "bubble": timeline.bubble}
        json.dump({"traceEvents": out, "displayTimeUnit": "ms", "otherData": meta}, f)
    return len(out) - timeline.d


def draw(timeline: Timeline, path, title: str | None = None) -> None:
    """Save a PNG like the paper's Figures 1-3: one row per stage (stage 0 on top), forwards
    blue, backwards green, labelled with micro-batch ids; odd weight versions drawn lighter
    and hatched; optimizer steps as black marks labelled with the version they create."""
    import matplotlib

    matplotlib.use("Agg")  # headless; never opens a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    span = timeline.makespan or 1.0
    t0 = min((e.start for evs in timeline.events for e in evs), default=0.0)
    boxes = max((sum(e.action.kind in COMPUTE for e in evs) for evs in timeline.events), default=0)
    fig, ax = plt.subplots(figsize=(min(4 + 0.3 * boxes, 40), 0.6 * timeline.d + 1.4))
    colours = {FORWARD: "#4f81bd", BACKWARD: "#7fbf5f"}
    for s, evs in enumerate(timeline.events):
        y = timeline.d - 1 - s
        for e in evs:
            a, x, w = e.action, e.start - t0, e.end - e.start
            if a.kind in COMPUTE:
                odd = a.version % 2 == 1
                ax.broken_barh(
                    [(x, w)],
                    (y + 0.1, 0.8),
                    facecolors=colours[a.kind],
                    alpha=0.55 if odd else 1.0,
                    hatch="//" if odd else None,
                    edgecolor="black",
                    linewidth=0.5,
                )
                if w >= span / 120:
                    ax.text(x + w / 2, y + 0.5, str(a.mb), ha="center", va="center", fontsize=7)
            elif a.kind is OPTIMIZER_STEP:
                if w > 0:
                    ax.broken_barh(
                        [(x, w)], (y + 0.1, 0.8), facecolors="white", hatch="xx", edgecolor="black", linewidth=0.5
                    )
                ax.plot([x + w, x + w], [y + 0.05, y + 0.95], color="black", linewidth=1.5)
                ax.text(x + w, y + 0.98, f"v{a.version}", fontsize=6, ha="center", va="bottom")
    ax.set_yticks([timeline.d - 1 - s + 0.5 for s in range(timeline.d)])
    ax.set_yticklabels([f"stage {s}" for s in range(timeline.d)])
    ax.set_xlim(0, span * 1.02)  # room for the last optimizer mark
    ax.set_ylim(0, timeline.d + 0.2)
    ax.set_xlabel("time")
    ax.set_title(title or f"{timeline.name}: makespan {span:g}, bubble {timeline.bubble:.1%}")
    ax.legend(
        handles=[
            Patch(color=colours[FORWARD], label="forward"),
            Patch(color=colours[BACKWARD], label="backward"),
            Patch(facecolor="white", edgecolor="black", hatch="//", label="odd weight version"),
        ],
        loc="upper right",
        bbox_to_anchor=(1.0, -0.18),
        ncol=3,
        fontsize=7,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
