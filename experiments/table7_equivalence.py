"""How close L2L ends to the baseline from the same seed: largest differences in dev scores and in weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from suite.core.check import relative_error
from suite.records.schema import Record, metrics_of

# (reference row, compared row, what bounds their difference)
PAIRS = (
    ("baseline-fp32", "l2l-fp32", "float rounding (same arithmetic, keyed dropout)"),
    ("baseline-amp", "l2l-cmp", "not expected equal: AMP computes from FP32 weights, CMP from 16-bit copies"),
)


def _weights(results_dir: Path, rec: Record) -> dict[str, torch.Tensor] | None:
    path = rec["metrics"].get("final_weights")
    if not path:
        return None
    path = Path(results_dir) / path  # an absolute path stays as it is
    return torch.load(path, weights_only=True) if path.exists() else None


def compare(results_dir: Path, ref: Record, other: Record, store: dict | None = None) -> dict:
    """Largest |difference| of dev scores (final and along the curve, in points) and of the final weights. The
    weights' figures go into `store` under the two weights' digests, and come from it where the weights files
    are gone (results/.cache/ stays on the machine that trained; the store is committed)."""
    a, b = ref["metrics"], other["metrics"]
    keys = [k for k in ("accuracy", "f1", "matthews", "pearson", "spearman") if k in a and k in b]
    final = max((abs(a[k] - b[k]) for k in keys if _finite(a[k], b[k])), default=math.nan)
    by_step = {p["step"]: p for p in b.get("curve", [])}
    along = [
        abs(p[k] - by_step[p["step"]][k])
        for p in a.get("curve", [])
        if p["step"] in by_step
        for k in keys
        if _finite(p[k], by_step[p["step"]][k])
    ]
    # Training loss along the curve: how long the two runs agree, to tell rounding amplified over many steps
    # (agreement first, then a smooth growth) from a different computation (a gap from the first steps).
    losses = [
        (p["step"], p["train_loss"], by_step[p["step"]]["train_loss"])
        for p in a.get("curve", [])
        if p["step"] in by_step and _finite(p.get("train_loss"), by_step[p["step"]].get("train_loss"))
    ]
    rel = [(step, abs(x - y) / max(abs(x), 1e-12)) for step, x, y in losses]
    agree = [step for step, r in rel]
    first_off = next((i for i, (_, r) in enumerate(rel) if r > LOSS_AGREE), len(rel))
    out = {
        "loss_agree_until": agree[first_off - 1] if first_off else None,
        "loss_steps": agree[-1] if agree else None,
        "loss_rel_last": rel[-1][1] if rel else None,
        "dev_final": final,
        "dev_curve": max(along, default=math.nan),
        "same_digest": a.get("final_weights_digest") == b.get("final_weights_digest"),
        "weight_abs": None,
        "weight_rel": None,
        "weight_rel_name": None,
    }
    wa, wb = _weights(results_dir, ref), _weights(results_dir, other)
    if wa is not None and wb is not None and wa.keys() == wb.keys():
        out["weight_abs"] = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        family = ref["config"].get("run", {}).get("model", {}).get("family", "bert")
        gated = sorted(set(wa) - _gradient_free(family, wa))
        name = max(gated, key=lambda k: relative_error(wb[k], wa[k]))
        out["weight_rel"], out["weight_rel_name"] = relative_error(wb[name], wa[name]), name
    key = f"{a.get('final_weights_digest')}:{b.get('final_weights_digest')}"
    if store is None or not (a.get("final_weights_digest") and b.get("final_weights_digest")):
        return out
    if out["weight_abs"] is not None:
        store[key] = {k: out[k] for k in ("weight_abs", "weight_rel", "weight_rel_name")}
    elif key in store:
        out.update(store[key])
    return out


def store_path(exp, results_dir: Path) -> Path:
    """The committed weights comparisons, keyed by the two final weights' digests."""
    return Path(results_dir) / f"{exp.name}_equivalence.json"


LOSS_AGREE = 1e-5  # relative difference of the mean training loss between evaluations


def _gradient_free(family: str, names) -> set[str]:
    """Tensors with zero gradient in exact arithmetic (their values are pure rounding noise), by the family's rule."""
    from suite.harness.families import FAMILIES

    class _Named:  # the rule reads parameter names only
        def named_parameters(self):
            return ((n, None) for n in names)

    return FAMILIES[family].gradient_free(_Named())


SEED_ROWS = ("baseline-fp32", "baseline-fp32-s1", "baseline-fp32-s2")  # the seed-to-seed spread (table7.SEEDS)


def verdict(by_name: dict[str, Record], task: str) -> dict:
    """The paper's claim for one task, from its records' final dev scores (`score`, the task's metric): L2L FP32
    within the seed-to-seed spread (max - min of the FP32 baseline over its seeds) of the same-seed baseline, and
    L2L-CMP within that spread of AMP. A verdict needs every seed row; a pair, both rows."""

    def score(row: str):
        rec = by_name.get(f"{task}-{row}")
        value = metrics_of(rec).get("score") if rec is not None and rec["status"] == "ok" else None
        return value if _finite(value) else None

    seeds = [score(r) for r in SEED_ROWS]
    have = [x for x in seeds if x is not None]
    out = {"seeds": have, "fp32": score("l2l-fp32"), "amp": score("baseline-amp"), "cmp": score("l2l-cmp")}
    out["low"], out["high"] = (min(have), max(have)) if have else (None, None)
    out["spread"] = out["high"] - out["low"] if have else None
    full = len(have) == len(SEED_ROWS)

    def judge(x, against):
        gap = abs(x - against)
        return "reproduced" if gap <= out["spread"] else f"not reproduced ({gap:.2f} > {out['spread']:.2f})"

    if not full or out["fp32"] is None:
        missing = ", no L2L FP32" if out["fp32"] is None else ""
        out["fp32_verdict"] = f"pending ({len(have)} of {len(SEED_ROWS)} seeds{missing})"
    else:
        out["fp32_verdict"] = judge(out["fp32"], seeds[0])
    out["cmp_verdict"] = (
        "pending" if not full or out["amp"] is None or out["cmp"] is None else judge(out["cmp"], out["amp"])
    )
    return out


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def _fmt(x, spec: str = ".3g") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def write(exp, results_dir: Path) -> list[Path]:
    """results/table7_equivalence.md: one line per task and pair, per profile/device section."""
    from suite.report import tables

    lines = [
        "# Table 7 equivalence: L2L against the baseline from the same seed",
        "",
        "Generated from results/runs/ and the final weights under results/.cache/ (their figures kept in "
        "table7_equivalence.json, by the weights' digests, for machines that no longer hold them) by `python -m "
        "suite run table7`; do not edit by hand. The paper: L2L 'is almost mathematically equivalent' to the baseline. "
        "With keyed dropout, FP32 runs of both from one seed should end within float rounding. Dev "
        "differences are in points of the task's metrics (largest over them); weights: largest absolute "
        "element difference, and the largest norm-wise relative difference of one tensor (leaving out "
        "attention key biases, whose gradient is zero in exact arithmetic so their values are rounding "
        "noise). `train loss within 1e-5 through step` is the last evaluation up to which the mean training "
        "losses between evaluations agree to 1e-5 (relative), and their relative difference at the end: runs "
        "that agree first and then drift smoothly apart show rounding amplified by training (the baseline sums "
        "micro-batches of 16 where L2L runs one of 32, so the last bits differ from the first step); a "
        "different computation would differ from the first evaluation.",
        "",
    ]
    found = False
    stored = store_path(exp, results_dir)
    store = json.loads(stored.read_text()) if stored.exists() else {}
    for title, cells, records in tables.sections(exp, Path(results_dir)):
        by_name = {c.row.name: (c, r) for c, r in zip(cells, records)}
        table = []
        for task in dict.fromkeys(c.row.task for c in cells):
            for ref_v, other_v, bound in PAIRS:
                (_, ref), (_, other) = (
                    by_name.get(f"{task}-{ref_v}", (None, None)),
                    by_name.get(f"{task}-{other_v}", (None, None)),
                )
                if not (ref and other and ref["status"] == other["status"] == "ok"):
                    continue
                d = compare(results_dir, ref, other, store)
                weights = (
                    "not on disk | not on disk"
                    if d["weight_abs"] is None
                    else f"{_fmt(d['weight_abs'])} | {_fmt(d['weight_rel'])} (`{d['weight_rel_name']}`)"
                )
                loss = (
                    "—"
                    if d["loss_steps"] is None
                    else f"{_fmt(d['loss_agree_until'], 'd') if d['loss_agree_until'] is not None else 'none'} of "
                    f"{d['loss_steps']} (last: {_fmt(d['loss_rel_last'], '.1e')})"
                )
                table.append(
                    f"| {task.upper()} | {other_v} vs {ref_v} | {_fmt(d['dev_final'])} | "
                    f"{_fmt(d['dev_curve'])} | {loss} | {weights} | {'yes' if d['same_digest'] else 'no'} | "
                    f"{bound} |"
                )
        if table:
            found = True
            lines += [
                f"## {title}",
                "",
                "| task | pair | dev final | dev along curve | train loss within 1e-5 "
                "through step | weights abs | weights rel (tensor) | bitwise equal | bound |",
                "|---|---|---|---|---|---|---|---|---|",
                *table,
                "",
                "The claim per task (final dev score, the task's metric): L2L FP32 within the seed-to-seed "
                f"spread (max - min of the FP32 baseline over its {len(SEED_ROWS)} seeds) of the same-seed "
                "baseline; L2L-CMP within that spread of AMP.",
                "",
                "| task | baseline FP32 by seed | range (spread) | L2L FP32 | FP32 verdict | AMP | L2L-CMP "
                "| CMP verdict |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for task in dict.fromkeys(c.row.task for c in cells):
                v = verdict({k: r for k, (_, r) in by_name.items()}, task)
                seeds = ", ".join(_fmt(x, ".1f") for x in v["seeds"]) or "—"
                span = "—" if v["low"] is None else f"{v['low']:.1f}-{v['high']:.1f} ({v['spread']:.1f})"
                lines.append(
                    f"| {task.upper()} | {seeds} | {span} | {_fmt(v['fp32'], '.1f')} | {v['fp32_verdict']} | "
                    f"{_fmt(v['amp'], '.1f')} | {_fmt(v['cmp'], '.1f')} | {v['cmp_verdict']} |"
                )
            lines.append("")
    if not found:
        lines += ["No task has both rows of a pair finished yet.", ""]
    out = Path(results_dir) / f"{exp.name}_equivalence.md"
    out.write_text("\n".join(lines))
    if store:
        stored.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    return [out, *([stored] if store else [])]
