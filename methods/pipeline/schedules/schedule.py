"""Schedule IR: per-stage action lists and pure generators for GPipe, 1F1B/Flush and 2BW."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class Kind(str, Enum):
    """What one action does; a str so records and JSON can carry the plain name."""

    FORWARD = "FORWARD"
    BACKWARD = "BACKWARD"
    SEND_ACT = "SEND_ACT"
    RECV_ACT = "RECV_ACT"
    SEND_GRAD = "SEND_GRAD"
    RECV_GRAD = "RECV_GRAD"
    OPTIMIZER_STEP = "OPTIMIZER_STEP"
    ALL_REDUCE = "ALL_REDUCE"

    def __str__(self) -> str:
        return self.value


FORWARD, BACKWARD = Kind.FORWARD, Kind.BACKWARD
SEND_ACT, RECV_ACT = Kind.SEND_ACT, Kind.RECV_ACT
SEND_GRAD, RECV_GRAD = Kind.SEND_GRAD, Kind.RECV_GRAD
OPTIMIZER_STEP, ALL_REDUCE = Kind.OPTIMIZER_STEP, Kind.ALL_REDUCE

COMPUTE = frozenset({FORWARD, BACKWARD})
SENDS = frozenset({SEND_ACT, SEND_GRAD})
RECVS = frozenset({RECV_ACT, RECV_GRAD})
COMM = SENDS | RECVS
PER_STEP = frozenset({OPTIMIZER_STEP, ALL_REDUCE})  # the only kinds without a micro-batch

TOKEN = {
    FORWARD: "F",
    BACKWARD: "B",
    SEND_ACT: ">a",
    RECV_ACT: "<a",
    SEND_GRAD: ">g",
    RECV_GRAD: "<g",
    OPTIMIZER_STEP: "U",
    ALL_REDUCE: "R",
}
# Where the peer of a communication must sit: activations flow down the pipe, gradients up.
PEER_OFFSET = {SEND_ACT: +1, RECV_ACT: -1, SEND_GRAD: -1, RECV_GRAD: +1}

FLUSH_SCHEDULES = frozenset({"gpipe", "1f1b"})


@dataclass(frozen=True)
class Action:
    """One step of one stage. `mb` is the 0-indexed micro-batch id, global over the run
    (step = mb // m); None for OPTIMIZER_STEP / ALL_REDUCE. `version` is the weight version a
    F/B uses, or the version an OPTIMIZER_STEP creates. `peer` is the other stage of a send/recv."""

    kind: Kind
    stage: int
    mb: int | None
    version: int = 0
    peer: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))  # accept plain strings from records

    @property
    def token(self) -> str:
        """Compact text form: F3, B3@v1, >a3, <g3, U@v1, R."""
        t = TOKEN[self.kind] + ("" if self.mb is None else str(self.mb))
        return t + (f"@v{self.version}" if self.version else "")

    def __str__(self) -> str:
        return self.token


def message_key(a: Action) -> tuple[str, int, int, int | None]:
    """(channel, src, dst, mb): identical for a send and the receive that matches it."""
    channel = "a" if a.kind in (SEND_ACT, RECV_ACT) else "g"
    src, dst = (a.stage, a.peer) if a.kind in SENDS else (a.peer, a.stage)
    return channel, src, dst, a.mb


@dataclass
class Schedule:
    """A pipeline schedule: for each of `d` stages, the ordered actions it executes over
    `steps` iterations of `m` micro-batches each."""

    name: str
    d: int
    m: int
    steps: int
    actions: list[list[Action]]

    @property
    def n_microbatches(self) -> int:
        return self.m * self.steps

    def to_text(self, comm: bool = True) -> str:
        """One line per stage, e.g. `s0: F0 >a0 F1 >a1 <g0 B0 ...`; comm=False hides sends/recvs."""
        return "\n".join(
            f"s{s}: " + " ".join(a.token for a in acts if comm or a.kind not in COMM)
            for s, acts in enumerate(self.actions)
        )

    def __str__(self) -> str:
        return self.to_text()


def weight_version(name: str, mb: int, m: int) -> int:
    """Version micro-batch `mb` must use for both its forward and backward.

    2BW (paper §3.1, k = mb + 1): max(floor((k-1)/m) - 1, 0). Flush schedules (and any other
    name) run all of step t on version t, i.e. the weights after t optimizer steps."""
    if name == "2bw":
        return max(mb // m - 1, 0)
    return mb // m


def _check_args(d: int, m: int, steps: int) -> None:
    for label, v in (("d", d), ("m", m), ("steps", steps)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{label} must be a positive int, got {v!r}")


def _forward(s: int, d: int, mb: int, v: int) -> list[Action]:
    out = [Action(RECV_ACT, s, mb, peer=s - 1)] if s > 0 else []
    out.append(Action(FORWARD, s, mb, v))
    if s < d - 1:
        out.append(Action(SEND_ACT, s, mb, peer=s + 1))
    return out


def _backward(s: int, d: int, mb: int, v: int) -> list[Action]:
    out = [Action(RECV_GRAD, s, mb, peer=s + 1)] if s < d - 1 else []
    out.append(Action(BACKWARD, s, mb, v))
    if s > 0:
        out.append(Action(SEND_GRAD, s, mb, peer=s - 1))
    return out


def _update(s: int, new_version: int) -> list[Action]:
    # All-reduce across stage replicas first (a no-op at width 1), then step the optimizer.
    return [Action(ALL_REDUCE, s, None), Action(OPTIMIZER_STEP, s, None, new_version)]


def _one_f_one_b_order(n: int, warmup: int) -> list[tuple[Kind, int]]:
    """Warm-up forwards, then alternate F(i + warmup), B(i), then drain the remaining backwards."""
    w = min(warmup, n)
    order = [(FORWARD, i) for i in range(w)]
    for i in range(n - w):
        order += [(FORWARD, i + w), (BACKWARD, i)]
    return order + [(BACKWARD, i) for i in range(n - w, n)]


def gpipe(d: int, m: int, steps: int = 1) -> Schedule:
    """GPipe: per step all m forwards, then all m backwards, then all-reduce + optimizer step.

    Backwards run in ascending micro-batch order (as drawn in the paper's Figure 3) rather than
    reverse: the bubble is the same, and every flush schedule then accumulates weight gradients
    in the same order mb0, mb1, ..., so GPipe and 1F1B executors can be compared bit for bit."""
    _check_args(d, m, steps)
    actions: list[list[Action]] = [[] for _ in range(d)]
    for s in range(d):
        for t in range(steps):
            mbs = range(t * m, (t + 1) * m)
            for mb in mbs:
                actions[s] += _forward(s, d, mb, t)
            for mb in mbs:
                actions[s] += _backward(s, d, mb, t)
            actions[s] += _update(s, t + 1)
    return Schedule("gpipe", d, m, steps, actions)


def one_f_one_b(d: int, m: int, steps: int = 1) -> Schedule:
    """PipeDream-Flush: per step, stage s does min(d-s-1, m) warm-up forwards, then 1F1B, then
    drains its backwards and flushes (all-reduce + optimizer step). At most d-s micro-batches
    are in flight on stage s instead of GPipe's m."""
    _check_args(d, m, steps)
    actions: list[list[Action]] = [[] for _ in range(d)]
    for s in range(d):
        for t in range(steps):
            for kind, j in _one_f_one_b_order(m, d - s - 1):
                emit = _forward if kind is FORWARD else _backward
                actions[s] += emit(s, d, t * m + j, t)
            actions[s] += _update(s, t + 1)
    return Schedule("1f1b", d, m, steps, actions)


def two_bw(d: int, m: int, steps: int = 1) -> Schedule:
    """PipeDream-2BW: one 1F1B stream over all steps*m micro-batches with no flush in between.

    Micro-batch mb uses weight_version("2bw", mb, m) for its forward and backward. Stage s steps
    its optimizer right after the backward of the last micro-batch of each group of m, creating
    version g+1 from group g; version g-1 is dead by then, so at most two versions are live.
    Warm-up is min(d-s-1, m): F(k) needs the version made after group (k//m - 2), which 1F1B
    guarantees only while the warm-up does not exceed m (so m >= d-1 runs at full speed;
    smaller m is throttled rather than rejected)."""
    _check_args(d, m, steps)
    actions: list[list[Action]] = [[] for _ in range(d)]
    for s in range(d):
        for kind, mb in _one_f_one_b_order(steps * m, min(d - s - 1, m)):
            v = weight_version("2bw", mb, m)
            if kind is FORWARD:
                actions[s] += _forward(s, d, mb, v)
            else:
                actions[s] += _backward(s, d, mb, v)
                if (mb + 1) % m == 0:  # last micro-batch of group mb // m
                    actions[s] += _update(s, (mb + 1) // m)
    return Schedule("2bw", d, m, steps, actions)


GENERATORS = {"gpipe": gpipe, "1f1b": one_f_one_b, "2bw": two_bw}


# A 2BW run is one 1F1B stream, but Method.step() hands over one minibatch at a time: the stream is
# cut into per-step windows. Window t holds, per stage, the actions after the previous window up to
# (not including) the first action that needs minibatch t+1 or that updates with group t's
# gradients; the drain finishes the stream. Concatenated, windows and drain are exactly
# two_bw(d, m, steps) (tests/pipeline/test_pipeline_2bw.py), so every run obeys its validation.


def _window_cut(acts: list[Action], k: int, m: int) -> int:
    """Index of the first action that touches a micro-batch of group >= k or belongs to update k
    (R, U@vk): every stage's update k then falls in the same window, so a global clip norm and the
    per-update collectives pair across stages."""
    updates = 0
    for i, a in enumerate(acts):
        if a.mb is not None and a.mb >= k * m:
            return i
        if a.kind is ALL_REDUCE:
            updates += 1
            if updates >= k:
                return i
    return len(acts)


def _shift_groups(a: Action, groups: int, m: int) -> Action:
    """The same action `groups` minibatches later; F/B versions re-derived from the version rule,
    an update creates a version `groups` higher."""
    if a.kind is OPTIMIZER_STEP:
        return replace(a, version=a.version + groups)
    if a.mb is None:
        return a
    mb = a.mb + groups * m
    return replace(a, mb=mb, version=weight_version("2bw", mb, m) if a.kind in COMPUTE else a.version)


def two_bw_window(d: int, m: int, step: int, start: int = 0) -> list[list[Action]]:
    """Per stage, the 2BW actions that run while minibatch `step` is handed in, for a stream that
    began at minibatch `start` (0, or the step after a drain). Window u >= 1 of a stream is window
    1 shifted by u - 1 minibatches (1F1B is periodic), so nothing grows with the run length."""
    u = step - start
    if u < 0:
        raise ValueError(f"step {step} precedes the stream start {start}")
    base = min(u, 1)
    sch = two_bw(d, m, base + 2)
    return [
        [_shift_groups(a, step - base, m) for a in acts[_window_cut(acts, base, m) : _window_cut(acts, base + 1, m)]]
        for acts in sch.actions
    ]


def two_bw_drain(d: int, m: int, steps: int, start: int = 0) -> list[list[Action]]:
    """Per stage, what remains of a 2BW stream after windows start..steps-1: the last group's
    outstanding backwards and the last update (stash and messages empty afterwards)."""
    if steps <= start:
        raise ValueError(f"nothing to drain: the stream starting at {start} ran no step before {steps}")
    # Cut where window 0 of a longer stream ends: a one-step schedule already drains before that.
    cuts = [_window_cut(acts, 1, m) for acts in two_bw(d, m, 2).actions]
    return [[_shift_groups(a, steps - 1, m) for a in acts[cut:]] for acts, cut in zip(two_bw(d, m, 1).actions, cuts)]
