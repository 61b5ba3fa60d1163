"""Timing rounds: a cell measured in several interleaved rounds becomes one record with a median and a spread."""

from __future__ import annotations

import json
import statistics

from suite.measure import contention, flops
from suite.records.schema import Outcome, Record, status_of

# Rates whose rounds are kept: the median is the cell's figure, min and max its spread.
RATES = ("throughput", "throughput_per_rank")
# Peaks take the largest round: what must fit.
PEAKS = (
    "memory_gb",
    "memory_reserved_gb",
    "device_peak_allocated",
    "device_peak_reserved",
    "host_peak_gb",
    "pinned_host_peak_gb",
    "memory_worst_rank_gb",
)


def merge(rounds: list[Outcome], planned: int) -> Outcome:
    """One record from the records of a cell's rounds so far: `ok` once all `planned` rounds are, else the
    failed round's status, or `partial: k/n rounds` while rounds remain. Measured rounds are never dropped."""
    ok = [r for r in rounds if r["status"] == "ok"]
    # Rounds of another code or harness (dropout path, attention kernel, LAMB kernel) than the latest are never
    # folded in: they are set aside, and the status says so, so a table never shows a mixed or silently thinned row.
    aside = [r for r in ok if comparable(r) != comparable(ok[-1])] if ok else []
    ok = [r for r in ok if r not in aside]
    last = rounds[-1]
    if last["status"] != "ok" and not ok:
        return dict(last, rounds=0)
    # A process that measured several rounds itself (suite.core.cell.throughput_rounds_cell) brings them each
    inside = [len(r["metrics"].get("throughput_rounds") or [None]) for r in ok]
    record = dict(ok[0], metrics=dict(ok[0]["metrics"]), rounds=sum(inside))
    m = record["metrics"]
    for key in RATES:
        values = [v for r in ok for v in _rounds_of(r["metrics"], key)]
        if len(values) == sum(inside):
            m[key] = statistics.median(values)
            m[f"{key}_rounds"] = values
        else:  # not every round has it: no spread of some of them
            m.pop(f"{key}_rounds", None)
    times = [r["metrics"]["step_time_median"] for r in ok if "step_time_median" in r["metrics"]]
    if len(times) == len(ok):
        m["step_time_median"] = statistics.median(times)
        m["step_time_min"] = min(r["metrics"]["step_time_min"] for r in ok)
        m["step_time_max"] = max(r["metrics"]["step_time_max"] for r in ok)
        m["timed_steps"] = sum(r["metrics"].get("timed_steps", 0) for r in ok)
    m.update(flops.achieved(m))  # TFLOPS and MFU of the merged throughput
    watched = [r["metrics"].get("contention") for r in ok]
    rates = m.get("throughput_rounds") or []
    if any(watched) or contention.apart(rates):  # contended when any round was, or when its rates lie far apart,
        m["contention"] = contention.merged([c or {} for c in watched], rates)  # whether or not a round was watched
    for key in PEAKS:
        values = [r["metrics"][key] for r in ok if isinstance(r["metrics"].get(key), (int, float))]
        if values:
            m[key] = max(values)
    record["duration_s"] = sum(r.get("duration_s") or 0.0 for r in rounds)
    if last["status"] != "ok":
        record.update(status=last["status"], error=last.get("error"))
    elif len(ok) < planned:
        record["status"] = f"partial: {len(ok)}/{planned} rounds"
        if aside:
            record["status"] += f", {len(aside)} set aside (another code or harness path)"
        # Kept so that a later call (a GPU campaign stage cut at its deadline) resumes the remaining rounds.
        record["round_records"] = [{k: r.get(k) for k in ROUND_FIELDS} for r in ok]
    return record


def _rounds_of(metrics: dict, key: str) -> list:
    """A round's figure for `key`, or the figures of the rounds a process measured itself; [] where it has none."""
    inside = metrics.get(f"{key}_rounds")
    if isinstance(inside, list):
        return inside
    return [metrics[key]] if isinstance(metrics.get(key), (int, float)) else []


ROUND_FIELDS = ("status", "metrics", "provenance", "duration_s")


def comparable(outcome: Outcome) -> tuple:
    """What rounds must share to be merged: the code they ran (provenance.code) and the harness it took."""
    prov = outcome.get("provenance") or {}
    return prov.get("code"), json.dumps(prov.get("harness"), sort_keys=True)


def resumable(record: Record | None, methodology: str, code: str) -> list[Outcome]:
    """The measured rounds of a partial record made by the same methodology and the same code (the cell's code now,
    suite.core.cell_code), to continue from; else none: the cell is measured anew."""
    if not record or status_of(record).kind != "partial":
        return []
    rounds = record.get("round_records") or []
    if any((r.get("provenance") or {}).get("methodology") != methodology for r in rounds):
        return []
    if any((r.get("provenance") or {}).get("code") != code for r in rounds):
        return []
    return [dict(r) for r in rounds if r.get("status") == "ok"]


def spread(metrics: dict, key: str) -> tuple[float, float] | None:
    """(min, max) of a rate's rounds, or None when it was measured once."""
    values = metrics.get(f"{key}_rounds")
    if not isinstance(values, list) or len(values) < 2:
        return None
    return min(values), max(values)
