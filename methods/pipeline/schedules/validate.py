"""Static proof that a schedule is well formed, deadlock free and within stash/version bounds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from methods.pipeline.schedules.schedule import (
    BACKWARD,
    COMM,
    COMPUTE,
    FORWARD,
    OPTIMIZER_STEP,
    PEER_OFFSET,
    PER_STEP,
    RECV_ACT,
    RECV_GRAD,
    RECVS,
    SEND_ACT,
    SEND_GRAD,
    SENDS,
    Action,
    Schedule,
    message_key,
    weight_version,
)


class ScheduleError(ValueError):
    """A schedule breaks a rule; the message names the stage, the action index and the rule."""


@dataclass
class ValidationReport:
    name: str
    peak_stash: list[int]  # per stage: max micro-batches forwarded but not yet backwarded
    stash_bound: list[int]  # per stage: the bound that peak_stash was checked against
    peak_live_versions: list[int]  # per stage: max weight versions that must be held at once
    counts: list[dict[str, int]]  # per stage: number of actions of each Kind (by value)
    rendezvous_safe: bool  # also deadlock free if a send blocks until its recv is posted
    order: list[tuple[int, int]]  # one global execution order (stage, action index) of the dry run


def _at(s: int, i: int, a: Action) -> str:
    return f"stage {s}, action {i} ({a.token})"


def stash_bound(name: str, d: int, m: int, steps: int, s: int) -> int:
    """GPipe stashes a whole step (m); 1F1B and 2BW keep at most d-s micro-batches in flight."""
    if name == "gpipe":
        return m
    if name in ("1f1b", "2bw"):
        return d - s
    return m * steps  # unknown schedule: only the trivial bound


def version_bound(name: str) -> int:
    return 1 if name in ("gpipe", "1f1b") else 2  # flushes keep one version; 2BW double-buffers


def _check_structure(sch: Schedule) -> None:
    if len(sch.actions) != sch.d:
        raise ScheduleError(f"schedule has {len(sch.actions)} stage lists but d = {sch.d}")
    n = sch.n_microbatches
    for s, acts in enumerate(sch.actions):
        for i, a in enumerate(acts):
            if a.stage != s:
                raise ScheduleError(f"{_at(s, i, a)}: action says stage {a.stage} but sits in list {s}")
            if a.kind in PER_STEP:
                if a.mb is not None:
                    raise ScheduleError(f"{_at(s, i, a)}: {a.kind} must not carry a micro-batch")
            elif not isinstance(a.mb, int) or not 0 <= a.mb < n:
                raise ScheduleError(f"{_at(s, i, a)}: micro-batch {a.mb!r} outside 0..{n - 1}")
            want = s + PEER_OFFSET[a.kind] if a.kind in COMM else None
            if a.peer != want or (want is not None and not 0 <= want < sch.d):
                raise ScheduleError(f"{_at(s, i, a)}: {a.kind} must have peer {want}, has {a.peer}")


def _check_compute(sch: Schedule) -> list[dict[str, int]]:
    """Exactly one F and one B per micro-batch per stage, B after F; one update per step."""
    counts = []
    for s, acts in enumerate(sch.actions):
        done: dict = {FORWARD: set(), BACKWARD: set()}
        for i, a in enumerate(acts):
            if a.kind not in COMPUTE:
                continue
            if a.mb in done[a.kind]:
                raise ScheduleError(f"{_at(s, i, a)}: duplicate {a.kind} of micro-batch {a.mb}")
            if a.kind is BACKWARD and a.mb not in done[FORWARD]:
                raise ScheduleError(
                    f"{_at(s, i, a)}: backward of micro-batch {a.mb} precedes its "
                    "forward on the same stage (rule: B after F)"
                )
            done[a.kind].add(a.mb)
        for kind in (FORWARD, BACKWARD):
            missing = sorted(set(range(sch.n_microbatches)) - done[kind])
            if missing:
                raise ScheduleError(
                    f"stage {s}: missing {kind} of micro-batch(es) {missing[:8]} "
                    "(rule: exactly one F and one B per micro-batch per step)"
                )
        c = Counter(a.kind.value for a in acts)
        for kind in PER_STEP:
            if c[kind.value] != sch.steps:
                raise ScheduleError(f"stage {s}: {c[kind.value]} {kind} actions, expected one per step = {sch.steps}")
        counts.append(dict(c))
    return counts


def _check_pairing(sch: Schedule) -> None:
    """Every send has exactly one receive with the same channel, endpoints and micro-batch."""
    where: dict[str, dict] = {"send": {}, "recv": {}}
    for s, acts in enumerate(sch.actions):
        for i, a in enumerate(acts):
            if a.kind in COMM:
                side = "send" if a.kind in SENDS else "recv"
                key = message_key(a)
                if key in where[side]:
                    raise ScheduleError(f"{_at(s, i, a)}: duplicate {a.kind} of micro-batch {a.mb}")
                where[side][key] = (s, i, a)
    for side, other in (("send", "recv"), ("recv", "send")):
        for key, (s, i, a) in where[side].items():
            if key not in where[other]:
                verb = "to" if side == "send" else "from"
                raise ScheduleError(
                    f"{_at(s, i, a)}: {a.kind} {verb} stage {a.peer} has no "
                    f"matching {other} of micro-batch {a.mb} on stage {a.peer}"
                )


def _check_dataflow(sch: Schedule) -> None:
    """Inputs arrive before use, outputs leave after they are produced, on every boundary."""
    for s, acts in enumerate(sch.actions):
        pos = {(a.kind, a.mb): i for i, a in enumerate(acts)}
        rules = []
        if s > 0:
            rules += [
                (RECV_ACT, FORWARD, "activation received before forward"),
                (BACKWARD, SEND_GRAD, "gradient sent after backward"),
            ]
        if s < sch.d - 1:
            rules += [
                (FORWARD, SEND_ACT, "activation sent after forward"),
                (RECV_GRAD, BACKWARD, "gradient received before backward"),
            ]
        for mb in range(sch.n_microbatches):
            for first, then, rule in rules:
                if (first, mb) not in pos or (then, mb) not in pos:
                    gone = first if (first, mb) not in pos else then
                    raise ScheduleError(f"stage {s}: no {gone} of micro-batch {mb} (rule: {rule})")
                if pos[first, mb] > pos[then, mb]:
                    i = pos[then, mb]
                    raise ScheduleError(f"{_at(s, i, acts[i])}: out of order (rule: {rule})")


def execution_order(sch: Schedule) -> list[tuple[int, int]]:
    """Dry run with buffered sends and blocking receives; ScheduleError if all stages block."""
    ptr, sent, order = [0] * sch.d, Counter(), []
    while True:
        progress = False
        for s, acts in enumerate(sch.actions):
            i = ptr[s]
            while i < len(acts):
                a = acts[i]
                if a.kind in RECVS:
                    if not sent[message_key(a)]:
                        break
                    sent[message_key(a)] -= 1
                elif a.kind in SENDS:
                    sent[message_key(a)] += 1
                order.append((s, i))
                i += 1
            progress |= i != ptr[s]
            ptr[s] = i
        if all(p == len(acts) for p, acts in zip(ptr, sch.actions)):
            return order
        if not progress:
            waits = [
                f"{_at(s, p, acts[p])} waits for "
                f"{SEND_ACT if acts[p].kind is RECV_ACT else SEND_GRAD} of micro-batch "
                f"{acts[p].mb} from stage {acts[p].peer}"
                for s, (p, acts) in enumerate(zip(ptr, sch.actions))
                if p < len(acts)
            ]
            raise ScheduleError("deadlock (cyclic wait, no stage can progress): " + "; ".join(waits))


def rendezvous_safe(sch: Schedule) -> bool:
    """Whether the schedule also completes when each send blocks until the peer reaches the
    matching receive (blocking NCCL/gloo send without isend or batched p2p)."""
    ptr = [0] * sch.d
    acts = sch.actions
    while True:
        progress = False
        for s in range(sch.d):
            while ptr[s] < len(acts[s]):
                a = acts[s][ptr[s]]
                if a.kind in COMM:
                    p = a.peer
                    b = acts[p][ptr[p]] if ptr[p] < len(acts[p]) else None
                    if (
                        b is None
                        or b.kind not in COMM
                        or (a.kind in SENDS) == (b.kind in SENDS)
                        or message_key(a) != message_key(b)
                    ):
                        break
                    ptr[p] += 1
                ptr[s] += 1
                progress = True
        if all(p == len(x) for p, x in zip(ptr, acts)):
            return True
        if not progress:
            return False


def _check_stash(sch: Schedule) -> tuple[list[int], list[int]]:
    peaks, bounds = [], []
    for s, acts in enumerate(sch.actions):
        bound = stash_bound(sch.name, sch.d, sch.m, sch.steps, s)
        live = peak = 0
        for i, a in enumerate(acts):
            live += (a.kind is FORWARD) - (a.kind is BACKWARD)
            if live > bound:
                raise ScheduleError(
                    f"{_at(s, i, a)}: {live} micro-batches in flight (forwarded, "
                    f"not yet backwarded) exceeds the {sch.name} stash bound "
                    f"{bound}"
                )
            peak = max(peak, live)
        peaks.append(peak)
        bounds.append(bound)
    return peaks, bounds


def _check_versions(sch: Schedule) -> list[int]:
    """Version rule per F/B, F and B agree, versions exist when used, few versions live."""
    peaks, bound = [], version_bound(sch.name)
    for s, acts in enumerate(sch.actions):
        pending = Counter(a.version for a in acts if a.kind in COMPUTE)  # uses still to come
        fwd_version: dict[int, int] = {}
        latest = peak = 0
        for i, a in enumerate(acts):
            if a.kind is OPTIMIZER_STEP:
                if a.version != latest + 1:
                    raise ScheduleError(
                        f"{_at(s, i, a)}: optimizer step must create version {latest + 1}, creates {a.version}"
                    )
                latest = a.version
            elif a.kind in COMPUTE:
                if a.kind is FORWARD:
                    fwd_version[a.mb] = a.version
                elif a.version != fwd_version[a.mb]:
                    raise ScheduleError(
                        f"{_at(s, i, a)}: backward uses version {a.version} but "
                        f"its forward used {fwd_version[a.mb]} (rule: same "
                        "version)"
                    )
                want = weight_version(sch.name, a.mb, sch.m)
                if a.version != want:
                    raise ScheduleError(
                        f"{_at(s, i, a)}: uses version {a.version}, the {sch.name} version rule gives {want}"
                    )
                if a.version > latest:
                    raise ScheduleError(
                        f"{_at(s, i, a)}: uses version {a.version} before it is "
                        f"produced (latest on this stage is {latest})"
                    )
            else:
                continue
            # Live: the latest (the optimizer's target) plus each produced version still to be used.
            live = {latest} | {v for v, c in pending.items() if c and v <= latest}
            if len(live) > bound:
                raise ScheduleError(
                    f"{_at(s, i, a)}: {len(live)} live weight versions "
                    f"{sorted(live)} exceed the {sch.name} bound {bound}"
                )
            peak = max(peak, len(live))
            if a.kind in COMPUTE:
                pending[a.version] -= 1
                if not pending[a.version]:
                    del pending[a.version]
        peaks.append(peak)
    return peaks


def validate(sch: Schedule) -> ValidationReport:
    """Run every check; raise ScheduleError on the first broken rule, else report the metrics."""
    _check_structure(sch)
    counts = _check_compute(sch)
    _check_pairing(sch)
    _check_dataflow(sch)
    order = execution_order(sch)
    peaks, bounds = _check_stash(sch)
    versions = _check_versions(sch)
    return ValidationReport(sch.name, peaks, bounds, versions, counts, rendezvous_safe(sch), order)
