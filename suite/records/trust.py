"""Plausibility by rule, never by hand: whether a timed record is `suspect`, and why, in words.

A suspect record is shown with its reason, and feeds no ratio, no figure's bar and no verdict (suite.report):

- **Too little of the device.** On a GPU at the `paper` profile, model FLOPs utilisation under its precision's floor
  (MFU_FLOOR). FP32: 10%. Every FP32 row measured at the paper's shapes on the H100 and the H200 (gradient
  accumulation at micro-batch 2, L2L at 64) ran at 30-35% of the FP32 dense peak; the one row at 7.7% (Table 2's
  FP32 baseline on the H100 at 1253528, 5.14 samples/s) was an attention path without tensor cores, removed by
  9884802, and the same row ran at 23.2 samples/s (34.8%) on the H200 at c9bdb98. 16-bit: 1%, against peaks of
  about 1,000 dense TFLOPS: the slowest honest 16-bit row, AMP at micro-batch 2 (1,024 tokens, launch-bound), ran
  at 1.9-2.1% on both GPUs. Tiny and small profiles are launch-bound by design and have no floor.
- **A rate that moved.** Its rate more than MOVE times above or below the previous record of the same row on the
  same machine and profile made by another code, whatever its cell key (the index's `history`: a change of steps,
  warm-up or harness changes the key, and hides no move), unless another sweep of its own code measured it within
  MOVE of it: a measurement confirmed by a second sweep beside its reference is no longer suspect. Where the key
  changed, the reason names what changed (`steps 5 -> 3`).
"""

from __future__ import annotations

from suite.records.schema import Record, metrics_of, status_of

MFU_FLOOR = {"fp32": 0.10, "fp16": 0.01, "bf16": 0.01}
MOVE = 2.0
MIN_ROUNDS = 3  # a rate's verdict needs at least this many timing rounds of each row it reads


def timing_rounds(rec: Record) -> int:
    """The timing rounds a record's rate rests on: its `rounds`, and one where it says none (a record that predates
    the field was one round of a few steps; it never counts as enough)."""
    return int(rec.get("rounds") or 1)


def _code(rec: Record) -> str | None:
    return (rec.get("provenance") or {}).get("code")


def _rate(rec: Record | None) -> float | None:
    x = metrics_of(rec).get("throughput")
    return float(x) if isinstance(x, (int, float)) and x > 0 else None


def _flat(d: dict, at: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        out.update(_flat(v, f"{at}{k}.") if isinstance(v, dict) else {f"{at}{k}": v})
    return out


def key_change(rec: Record, prev: Record) -> str:
    """What differs between two records' cell configs, as `name old -> new` (the run's own names first), or ""."""
    a, b = _flat((prev.get("config") or {})), _flat((rec.get("config") or {}))
    changed = sorted(
        (k for k in a.keys() | b.keys() if a.get(k) != b.get(k)), key=lambda k: (not k.startswith("run."), k)
    )
    said = [f"{k.removeprefix('run.')} {a.get(k, '—')} -> {b.get(k, '—')}" for k in changed[:4]]
    return ", ".join(said) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def suspect(rec: Record | None, history: list[Record] = ()) -> str | None:
    """Why `rec` is suspect (see the module), or None. `history`: the other records of its row on its machine and
    profile, whatever their key (the index's `history`)."""
    if not rec or not status_of(rec).measured:
        return None
    rate = _rate(rec)
    if rate is None:
        return None
    mfu = metrics_of(rec).get("mfu")
    precision = (((rec.get("config") or {}).get("run") or {}).get("precision")) or ""
    floor = MFU_FLOOR.get(precision)
    if rec.get("device_type") == "cuda" and rec.get("profile") == "paper" and floor and isinstance(mfu, (int, float)):
        if mfu < floor:
            return f"MFU {mfu:.1%}, under the {floor:.0%} floor of {precision} on a GPU (suite/records/trust.py)"
    mine, when = _code(rec), str(rec.get("finished") or "")
    others = sorted(
        (r for r in history if _code(r) != mine and _rate(r) is not None and str(r.get("finished") or "") < when),
        key=lambda r: str(r.get("finished") or ""),
    )
    if not others:
        return None
    prev = others[-1]
    moved = rate / _rate(prev)
    if 1 / MOVE <= moved <= MOVE:
        return None
    again = [r for r in history if _code(r) == mine and r.get("sweep") != rec.get("sweep") and _rate(r) is not None]
    if any(1 / MOVE <= rate / _rate(r) <= MOVE for r in again):
        return None
    commit = str((prev.get("provenance") or {}).get("commit") or "")[:7] or "an earlier code"
    changed = (
        f" under another cell ({change or 'its key'})"
        if (change := key_change(rec, prev)) or (prev.get("key") != rec.get("key"))
        else ""
    )
    return (
        f"{rate:.3g} samples/s, {moved:.2f}x the {_rate(prev):.3g} measured at {commit}{changed}; "
        "not yet measured again"
    )
