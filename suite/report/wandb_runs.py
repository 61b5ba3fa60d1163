"""Records as W&B runs that compare: each record's run carries what its table's row shows (issue 64).

A run per current record (results/runs/), its id from its machine and cell key (tracking.run_id):

- **tags**: `method:`, `precision:`, `profile:`, `machine:`, `machine-kind:` and the record's kind (`measured`,
  `counted` or `projected`), and each trust mark the row carries;
- **config**: the record's cell config and provenance, and the fields a comparison filters on: `experiment`, `row`,
  `machine`, `sweep`, `commit`, `code`, `rounds`, and `section`, the title of the table section that shows the row
  (its profile, machine, device and variant): a section's rows are found together whatever sweep measured each,
  `table_sweep` naming the sweep of its reference row (`in_table` false, tag `not-in-table`: a record its table no
  longer shows, a later one of its row having replaced it, or its row no longer defined);
- **summary**: the record's figures, then what its row shows beside them: `paper/<metric>`, `ratio/<metric>` (only
  where the table shows that ratio), `ratio_paper/<metric>`, `within_noise/<metric>`, and the marks (`contended`,
  `suspect` with `suspect_reason`, `provisional`, `another_code`, `projected`) and `status_brief`;
- **history**: a timed record's rounds (`throughput` by round), and a fine-tuning run's steps.

Every field has one type in every run: a field whose records hold values of two types (a cap written 16 in one and
"16GB" in another) is written as text in every run (`one_type`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from suite.core.experiment import Experiment, all_experiments
from suite.core.kinds import KINDS, is_projected
from suite.core.rounds import RATES
from suite.measure import machines
from suite.measure.contention import contended
from suite.records import tracking
from suite.records.index import open_index
from suite.records.schema import Record, machine_of, metrics_of, status_of
from suite.records.tracking import RunPayload
from suite.records.trust import timing_rounds
from suite.report import tables


def record_kind(rec: Record) -> str:
    """What a record's figures are: `projected` (arithmetic on stated rates), `counted` (fake tensors or arithmetic on
    the host, whatever device it names) or `measured`."""
    kind = (rec.get("config") or {}).get("kind")
    if is_projected(kind):
        return "projected"
    if kind in KINDS and KINDS.entry(kind).on_host:
        return "counted"
    return "measured"


def machine_kind(rec: Record) -> str:
    """The catalogue's kind of a record's machine (`h100`, `h200`), else its device type (`cpu`)."""
    found = machines.of_slug(machine_of(rec))
    return found.name if found is not None else str(rec.get("device_type") or "unknown")


def _number(x: Any) -> float | int | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return None if isinstance(x, float) and math.isnan(x) else x


def _flat(d: dict, at: str = "") -> dict[str, Any]:
    """A nested dict as one level, keys joined by '/' (how W&B's UI folds a summary)."""
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        out.update(_flat(v, f"{at}{k}/") if isinstance(v, dict) else {f"{at}{k}": v})
    return out


def _history(metrics: dict) -> list[dict]:
    """A record's history: each timing round of a rate (`throughput` by round) and a fine-tuning run's steps."""
    rows: dict[int, dict] = {}
    for key in RATES:
        rounds = metrics.get(f"{key}_rounds")
        for i, v in enumerate(rounds if isinstance(rounds, list) else []):
            if _number(v) is not None:
                rows.setdefault(i, {"step": i})[key] = v
    for h in metrics.get("history") or []:
        if isinstance(h, dict) and isinstance(h.get("step"), int):
            rows.setdefault(h["step"], {}).update(h)
    return [rows[k] for k in sorted(rows)]


def _tags(rec: Record, kind: str, marks: dict[str, bool], in_table: bool) -> list[str]:
    run = ((rec.get("config") or {}).get("run")) or {}
    tags = [
        f"method:{rec.get('method')}",
        f"precision:{run.get('precision') or 'none'}",
        f"profile:{rec.get('profile')}",
        f"machine:{machine_of(rec)}",
        f"machine-kind:{machine_kind(rec)}",
        kind,
        *[name.replace("_", "-") for name, on in marks.items() if on],
        *([] if in_table else ["not-in-table"]),
    ]
    return [t[:64] for t in tags]  # W&B's longest tag


def _config(rec: Record, section: str, table_sweep: str, reference: str, kind: str) -> dict[str, Any]:
    prov = rec.get("provenance") or {}
    return {
        "experiment": rec.get("experiment"),
        "row": rec.get("row"),
        "method": rec.get("method"),
        "profile": rec.get("profile"),
        "device_type": rec.get("device_type"),
        "variant": rec.get("variant") or "",
        "settings": " ".join(rec.get("settings") or []),
        "machine": machine_of(rec),
        "machine_kind": machine_kind(rec),
        "record_kind": kind,
        "key": rec.get("key"),
        "sweep": rec.get("sweep") or "",
        "section": section,
        "in_table": bool(section),
        "table_sweep": table_sweep,
        "reference": reference,
        "commit": prov.get("commit") or "",
        "code": prov.get("code") or "",
        "rounds": timing_rounds(rec),
        "finished": str(rec.get("finished") or ""),
        "cell": rec.get("config") or {},
        # (its files' digests, provenance.code_files, stay in the record: `code` names them in one digest)
        "provenance": {k: v for k, v in prov.items() if k != "code_files"},
        "fingerprint": rec.get("machine") or {},
    }


def _shown(exp: Experiment, names: list[str], line: list[Any]) -> dict[str, Any]:
    """What a table row shows beside a record's figures: the paper's values, the ratios to the reference (ours only
    where the table shows one) and whether a rate's ratio is within noise."""
    at = dict(zip(names, line))
    out: dict[str, Any] = {}
    for m in exp.metrics:
        unit = f" ({m.unit})" if m.unit else ""
        if m.paper and (v := tables.paper_number(at.get(f"{m.label} paper{unit}"))) is not None:
            out[f"paper/{m.key}"] = v
        if m.ratio:
            for name, say in (("ours", "ratio"), ("paper", "ratio_paper"), ("within noise", "within_noise")):
                v = at.get(f"{m.key} x{exp.baseline} {name}")
                if v is not None:
                    out[f"{say}/{m.key}"] = v
    return out


def _marks(rec: Record, base: Record | None) -> dict[str, bool]:
    """The trust marks a table's status shows for a row (tables._status), each a bool."""
    return {
        "contended": contended(metrics_of(rec)),
        "suspect": bool(rec.get("suspect")),
        "provisional": status_of(rec).kind == "ok" and tables.thin_rate(rec),
        "another_code": bool(base and base is not rec and tables.another_code(rec, base)),
        "projected": record_kind(rec) == "projected",
    }


def _payload(rec: Record, section: str, table_sweep: str, exp: Experiment | None, shown: dict, brief: str):
    kind = record_kind(rec)
    base = rec.get("reference")
    marks = _marks(rec, base)
    figures = {k: v for k, v in _flat(metrics_of(rec)).items() if k != "history" and not k.endswith("_rounds")}
    summary = {
        **figures,
        **shown,
        **marks,
        "status": rec.get("status"),
        "status_kind": status_of(rec).kind,
        "status_brief": brief,
    }
    if marks["suspect"]:
        summary["suspect_reason"] = str(rec["suspect"])
    return RunPayload(
        rid=tracking.run_id(rec),
        name=f"{rec.get('experiment')}/{rec.get('row')}",
        group=str(rec.get("experiment")),
        job_type=str(rec.get("method")),
        tags=_tags(rec, kind, marks, bool(section)),
        config=_config(rec, section, table_sweep, exp.baseline if exp else "", kind),
        summary=summary,
        history=_history(metrics_of(rec)),
    )


def section_payloads(exp: Experiment, title: str, cells, records: list[Record | None]) -> list[RunPayload]:
    """The runs of one table section's records, each with what its row shows."""
    cols = tables.columns(exp, tables.has_flops(records), tables.has_busy(records))
    _, lines = tables.table_rows(exp, cells, records)
    briefs = tables.briefs(exp, cells, records)
    base = next((r for c, r in zip(cells, records) if c.row.name == exp.baseline), None)
    out = []
    for rec, line, brief in zip(records, lines, briefs):
        if rec is None:
            continue
        ref = rec.get("reference") or base
        rec = {**rec, "reference": ref}
        sweep = str((ref or {}).get("sweep") or "")
        out.append(_payload(rec, title, sweep, exp, _shown(exp, [c.name for c in cols], line), brief))
    return out


def payloads(
    results_dir: Path,
    experiments: Iterable[Experiment] | None = None,
    where: Callable[[Record], bool] | None = None,
    warn=print,
) -> list[RunPayload]:
    """The runs of every current record under `results_dir` (of `experiments` where given: definitions, each
    registered or not) that `where` accepts. A
    record no table shows (its row or experiment no longer defined) is a run all the same, with its figures and no
    section. Each field's one type is settled over every record's run, whatever is chosen: an export of some
    records writes each field as an export of all does."""
    every = open_index(results_dir).records(warn)
    exps = known(experiments)
    shown: dict[str, RunPayload] = {}
    for name in sorted({str(r.get("experiment")) for r in every}):
        if (exp := exps.get(name)) is None:
            continue
        try:
            for title, cells, records in tables.sections(exp, results_dir, warn):
                for run in section_payloads(exp, title, cells, records):
                    shown.setdefault(run.rid, run)
        except Exception as exc:  # noqa: BLE001 — one table that cannot be read keeps no other record from W&B
            warn(f"warning: {name}'s table could not be read ({type(exc).__name__}: {exc}); its records are exported "
                 "with their figures alone")  # fmt: skip
    runs = {}
    for rec in every:
        rid = tracking.run_id(rec)
        if rid not in runs:
            runs[rid] = shown.get(rid) or _payload(
                rec, "", "", exps.get(str(rec.get("experiment"))), {}, str(rec.get("status"))
            )
    one_type(list(runs.values()))
    names = {e.name for e in experiments or ()}
    chosen = [r for r in every if (not names or r.get("experiment") in names) and (where is None or where(r))]
    return [runs[rid] for rid in dict.fromkeys(tracking.run_id(r) for r in chosen)]


def known(experiments: Iterable[Experiment] | None = None) -> dict[str, Experiment]:
    """The experiments records are read by: every registered one, and `experiments` (a sweep's, registered or not)."""
    return {**all_experiments(), **{e.name: e for e in experiments or ()}}


def _type(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return "text" if isinstance(v, str) else "json"


def one_type(runs: list[RunPayload]) -> list[RunPayload]:
    """`runs` with every config and summary field of one type across them: where two runs hold values of different
    types under one field, every run writes it as text (JSON for a list or dict)."""
    seen: dict[tuple[str, str], set[str]] = {}
    for run in runs:
        for part in ("config", "summary"):
            for k, v in _flat(getattr(run, part)).items():
                if (t := _type(v)) is not None:
                    seen.setdefault((part, k), set()).add(t)
    mixed = {key for key, types in seen.items() if len(types) > 1}
    if not mixed:
        return runs
    for run in runs:
        for part in ("config", "summary"):
            fields = getattr(run, part)
            for k in [k for (p, k) in mixed if p == part]:
                _as_text(fields, k.split("/"))
    return runs


def _as_text(d: dict, path: list[str]) -> None:
    """The value at `path` in nested `d` (a summary's flat keys may hold '/': tried whole first) as text."""
    key = "/".join(path)
    if key in d:
        v = d[key]
        if _type(v) is not None and not isinstance(v, str):
            d[key] = json.dumps(v, default=str) if not isinstance(v, (bool, int, float)) else str(v)
        return
    if len(path) > 1 and isinstance(d.get(path[0]), dict):
        _as_text(d[path[0]], path[1:])
