"""Plausibility by rule, never by hand: whether a timed record is `suspect`, and why, in words.

A suspect record is shown with its reason, and feeds no ratio, no figure's bar and no verdict (suite.report):

- **Too little of the device.** On a GPU at the `paper` profile, model FLOPs utilisation under its precision's floor
  (MFU_FLOOR). FP32: 10%. Every FP32 row measured at the paper's shapes on the H100 and the H200 (gradient
  accumulation at micro-batch 2, L2L at 64) ran at 30-35% of the FP32 dense peak; the one row at 7.7% (Table 2's
  FP32 baseline on the H100 at 1253528, 5.14 samples/s) was an attention path without tensor cores, removed by
  9884802, and the same row ran at 23.2 samples/s (34.8%) on the H200 at c9bdb98. 16-bit: 1%, against peaks of
  about 1,000 dense TFLOPS: the slowest honest 16-bit row, AMP at micro-batch 2 (1,024 tokens, launch-bound), ran
  at 1.9-2.1% on both GPUs. Tiny and small profiles are launch-bound by design and have no floor.
- **A rate that moved.** Its rate more than MOVE times above or below the same cell's record of the previous code
  on the same machine (the store's earlier records), unless another sweep of its own code measured it within MOVE
  of it: a measurement confirmed by a second sweep beside its reference is no longer suspect.
"""

from __future__ import annotations

from suite.records.schema import Record, metrics_of, status_of

MFU_FLOOR = {"fp32": 0.10, "fp16": 0.01, "bf16": 0.01}
MOVE = 2.0


def _code(rec: Record) -> str | None:
    return (rec.get("provenance") or {}).get("code")


def _rate(rec: Record | None) -> float | None:
    x = metrics_of(rec).get("throughput")
    return float(x) if isinstance(x, (int, float)) and x > 0 else None


def suspect(rec: Record | None, earlier: list[Record] = ()) -> str | None:
    """Why `rec` is suspect (see the module), or None. `earlier`: the same cell's earlier records on its machine."""
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
    mine = _code(rec)
    others = sorted(
        (r for r in earlier if _code(r) != mine and _rate(r) is not None), key=lambda r: r.get("finished") or ""
    )
    if not others:
        return None
    prev = others[-1]
    moved = rate / _rate(prev)
    if 1 / MOVE <= moved <= MOVE:
        return None
    again = [r for r in earlier if _code(r) == mine and r.get("sweep") != rec.get("sweep") and _rate(r) is not None]
    if any(1 / MOVE <= rate / _rate(r) <= MOVE for r in again):
        return None
    commit = str((prev.get("provenance") or {}).get("commit") or "")[:7] or "an earlier code"
    return f"{rate:.3g} samples/s, {moved:.2f}x the {_rate(prev):.3g} measured at {commit}; not yet measured again"
