"""Tables rendered from records: results/<experiment>.md and .csv, one section per machine, the paper beside ours."""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shlex
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.config import paths
from suite.config.files import write_atomic
from suite.config.run import RunConfig
from suite.core.experiment import Cell
from suite.core.kinds import is_projected
from suite.core.rounds import RATES, spread
from suite.measure.contention import contended
from suite.measure.counting import ROLES
from suite.measure.machine import describe
from suite.records.index import open_index
from suite.records.schema import Record, machine_of, metrics_of, status_of
from suite.records.trust import MIN_ROUNDS, suspect, timing_rounds


@dataclass
class Column:
    """One column: its CSV (and W&B) name, its markdown heading, how a value reads in markdown, and whether the
    section's compact table shows it (every column is in the table folded below it)."""

    name: str
    title: str
    show: Callable[[Any], str]
    brief: bool = False


def _num(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) else None


def _text(x: Any) -> str:
    return "—" if x is None else str(x)


def _label(x: Any) -> str:
    return "" if x is None else str(x)  # blank: the label does not apply to what the row ran


# A size unit's scale in GB, the unit sizes are recorded in.
SIZE_UNITS = {"TB": 1e3, "GB": 1.0, "MB": 1e-3, "KB": 1e-6}


def size_unit(values: list[Any]) -> str:
    """The one unit of a column pair of sizes in GB (ours and the paper's): the largest in which the largest is 1 or
    more, so that no value needs an exponent and both columns read in the same unit."""
    top = max((abs(v) for v in map(paper_number, values) if v is not None), default=0.0)
    return next((u for u, scale in SIZE_UNITS.items() if top >= scale), "KB")


def as_printed(x: Any) -> str:
    """A paper value as the paper printed it: 10.51 stays 10.51 and 89.0 stays 89.0; a value whose printed
    trailing zero a float cannot keep (88.50) is written as a string in its experiment, and shown as such."""
    return "—" if x is None else repr(x) if isinstance(x, float) else str(x)


def paper_number(x: Any) -> float | None:
    """A paper value as a number for ratios: floats, and numbers written as strings ("88.50"); None for "NA"."""
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return _num(x)


def _shower(fmt: str, unit: str | None) -> Callable[[Any], str]:
    def show(x: Any) -> str:
        v = _num(x)
        if v is None:
            return _text(x)
        return f"{v / SIZE_UNITS[unit]:.3g}" if unit in SIZE_UNITS else fmt.format(v)

    return show


def _paper_shower(unit: str | None) -> Callable[[Any], str]:
    """The paper's value as printed, in its unit (GB for sizes); converted where the section reads in another."""

    def show(x: Any) -> str:
        v = paper_number(x)
        if v is None or unit not in SIZE_UNITS or unit == "GB":
            return as_printed(x)
        return f"{v / SIZE_UNITS[unit]:.3g}"

    return show


def _ratio(x: Any) -> str:
    return "—" if _num(x) is None else f"{x:.2f}x"


def _yes_no(x: Any) -> str:
    return "—" if x is None else ("yes" if x else "no")


def words(label: str) -> str:
    """A metric's label without its unit: "throughput (samples/s)" -> "throughput"."""
    return re.sub(r"\s*\([^)]*\)$", "", label)


def columns(exp, flops: bool = False, busy: bool = False, units: dict[str, str] | None = None) -> list[Column]:
    """The columns of one section: labels, status, sweep, then per metric ours (its rounds' spread when
    timed in rounds; with `flops`, a CUDA section's achieved TFLOPS and MFU beside its throughput; with `busy`,
    the share of a traced step in which the device computed) / paper / ratio to the baseline ours (whether within
    noise) / paper. A size metric reads in `units[key]` (size_unit; GB where not given), named in its heading.
    Names are the CSV's (stable: programs and the claims read them); titles are the page's, in words."""
    units = units or {}
    cols = [Column("row", "row", _text, True), Column("method", "method", _text, True)]
    cols += [Column(c, c, _label) for c in exp.label_columns]
    cols += [Column("status", "status", _text, True), Column("sweep", "sweep", _text)]
    for m in exp.metrics:
        unit, timed = m.unit, m.key in RATES
        shown_unit = units.get(m.key, unit) if unit in SIZE_UNITS else unit
        named = f"{m.label} ({shown_unit})" if shown_unit else m.label
        ours = f"{m.label} ours" if m.paper else m.label
        cols.append(
            Column(
                ours + (f" ({unit})" if unit else ""),
                f"{named} ours" if m.paper else named,
                _shower(m.fmt, shown_unit),
                m.brief,
            )
        )
        if timed:
            cols.append(Column(f"{m.label} spread", "spread", _text))
        if flops and m.key == "throughput":
            cols += [Column("TFLOPS", "TFLOPS", _shower("{:.1f}", ""), True), Column("MFU", "MFU", _percent, True)]
        if busy and m.key == "throughput":
            cols.append(Column("device busy", "device busy", _percent))
        if m.paper:
            cols.append(
                Column(
                    f"{m.label} paper" + (f" ({unit})" if unit else ""),
                    f"{named} paper",
                    _paper_shower(shown_unit),
                    m.brief,
                )
            )
        if m.ratio:
            ratio = f"{words(m.label)} ratio to {exp.baseline}"
            cols.append(Column(f"{m.key} x{exp.baseline} ours", f"{ratio}, ours", _ratio, m.brief))
            if timed:
                cols.append(Column(f"{m.key} x{exp.baseline} within noise", "within noise", _yes_no))
            cols.append(Column(f"{m.key} x{exp.baseline} paper", f"{ratio}, paper", _ratio, m.brief))
    return cols


def _percent(x: Any) -> str:
    return "—" if _num(x) is None else f"{100 * x:.1f}%"


def has_flops(records: list[Record | None]) -> bool:
    """Whether a section's records carry achieved FLOPs (CUDA throughput cells since #29): its TFLOPS and MFU show."""
    return any("model_tflops" in metrics_of(r) for r in records)


def has_busy(records: list[Record | None]) -> bool:
    """Whether a section's records carry a device's traced step timeline (L2L's on a GPU, since #31): its device
    busy % shows. On a CPU the device is the host, so the share says nothing of a device: not shown."""
    return any("device_busy" in metrics_of(r) and r.get("device_type") != "cpu" for r in records if r)


def _ran_as_defined(exp, cell, rec: Record | None) -> bool:
    """Whether a row ran as the paper's row it stands for: not a variant's row that the variant's --set changed
    (its reference row runs as the table defines it) and the method the row names. Only such a row shows the
    paper's values beside its own."""
    if rec is None:
        return True
    if (rec.get("config") or {}).get("variant") and cell.row.name != exp.baseline:
        return False
    return cell.run.method == cell.row.method


def _status(cell, rec, base_rec, metrics) -> tuple[str, str]:
    """A row's status in full (every flag with its reason: the table of every column) and brief (the flags'
    names: the compact table)."""
    status = rec["status"] if rec else (f"skipped: {cell.row.skip}" if cell.row.skip else "not run")
    full, brief = status, status
    if contended(metrics):
        full, brief = f"{full}, contended", f"{brief}, contended"
    if rec and rec.get("suspect"):  # shown with its reason; no ratio rests on it (suite/records/trust.py)
        full, brief = f"{full}, suspect: {rec['suspect']}", f"{brief}, suspect"
    if rec and is_projected((rec.get("config") or {}).get("kind")):  # figures of arithmetic, not of a run
        full, brief = f"{full}, projected (nothing measured)", f"{brief}, projected"
    if rec and status_of(rec).kind == "ok" and thin_rate(rec):  # its rate, and every ratio of it, rests on n rounds
        n = timing_rounds(rec)
        said = f"{n} timing round{'s' if n > 1 else ''}"
        full, brief = f"{full}, {said} (fewer than {MIN_ROUNDS}: provisional)", f"{brief}, {said}"
    if rec and base_rec and another_code(rec, base_rec):  # shown for context: no ratio crosses codes
        full += f", another code: {commit_of(rec)} (the reference's {commit_of(base_rec)})"
        brief += ", another code"
    if isinstance(allowance := metrics.get("count_allowance_gb"), (int, float)):
        # a peer counted on a CPU without the offload its GPU run has (suite.core.cell.count_cell)
        full += (
            f" (past the cap even with {allowance:.1f} GB on the host, as its offload would keep them)"
            if status == "oom"
            else f" (counted without its offload: up to {allowance:.1f} GB of this on the host on a GPU)"
        )
        brief += ", counted without its offload"
    return full, brief


def thin_rate(rec: Record | None) -> bool:
    """Whether a record's rate rests on fewer than MIN_ROUNDS timing rounds (a record that says none rests on one):
    one with a measured throughput (ok or partial), not a projection's; the one rule the status column, a claim's
    doubts and a figure's hatching share."""
    if not rec or not status_of(rec).measured or _num(metrics_of(rec).get("throughput")) is None:
        return False
    return not is_projected((rec.get("config") or {}).get("kind")) and timing_rounds(rec) < MIN_ROUNDS


def _values(exp, cell, rec, base_rec, base_row, flops: bool = False, device_busy: bool = False) -> list[Any]:
    status = rec["status"] if rec else (f"skipped: {cell.row.skip}" if cell.row.skip else "not run")
    metrics = metrics_of(rec)
    base_rec = (rec or {}).get("reference") or base_rec  # a row of an earlier sweep: that sweep's reference (sections)
    same_sweep = bool(rec and base_rec and rec.get("sweep") == base_rec.get("sweep"))
    # A memory ratio across sweeps, never across code: what a step allocates is the code's, not the machine's load
    same_code = bool(rec and base_rec and _code(rec) is not None and not another_code(rec, base_rec))
    # A row timed on a busy machine, or against a baseline that was, shows its figures but no ratio of a rate
    # (its memory ratios stand: load does not change what a step allocates).
    busy = contended(metrics) or contended(metrics_of(base_rec))
    # A suspect row (suite/records/trust.py), or one whose reference is, shows its figures and its reason, no ratio
    doubted = bool((rec or {}).get("suspect") or (base_rec or {}).get("suspect"))
    as_defined = _ran_as_defined(exp, cell, rec)
    labels = labels_of(exp, cell, rec)
    line: list[Any] = [
        cell.row.name,
        cell.run.method,  # what ran (a variant's method where it set one)
        *[None if labels.get(c) in ("NA", None) else labels[c] for c in exp.label_columns],
        _status(cell, rec, base_rec, metrics)[0],
        rec.get("sweep") if rec else None,
    ]
    for m in exp.metrics:
        # An oom record has metrics only when they say why (a projection's memory past its cap).
        value = metrics.get(m.key)
        # A figure, or a word where the metric is one (a projection's limit)
        ours = (value if isinstance(value, str) else _num(value)) if measured(status) else None
        paper = cell.row.paper.get(m.key) if as_defined else None
        line.append(ours)
        own = spread(metrics, m.key) if ours is not None else None
        if m.key in RATES:
            line.append(f"{m.fmt.format(own[0])}-{m.fmt.format(own[1])}" if own else None)
        if flops and m.key == "throughput":
            line += [
                metrics.get("model_tflops") if ours is not None else None,
                metrics.get("mfu") if ours is not None else None,
            ]
        if device_busy and m.key == "throughput":
            line.append(metrics.get("device_busy") if ours is not None else None)
        if m.paper:
            line.append(paper)
        if m.ratio:
            base = metrics_of(base_rec)
            b_ours = (
                _num(base.get(m.key))
                if base_rec
                and measured(base_rec["status"], oom=False)
                and (same_sweep or (same_code and m.key not in RATES))
                and not (m.key in RATES and busy)  # a busy row's rate takes no ratio, in the table or a figure
                and not doubted
                else None
            )
            b_paper = paper_number(base_row.paper.get(m.key)) if base_row else None
            line.append(ours / b_ours if ours is not None and b_ours else None)
            if m.key in RATES:
                theirs = spread(base, m.key)
                apart = own and theirs and b_ours and cell.row.name != exp.baseline
                line.append(own[0] <= theirs[1] and theirs[0] <= own[1] if apart else None)
            line.append(paper_number(paper) / b_paper if paper_number(paper) is not None and b_paper else None)
    return line


def _code(rec: Record) -> str | None:
    return (rec.get("provenance") or {}).get("code")


def made_by_a_code(rec: Record) -> bool:
    """Whether a record names the code that made it (a digest or a commit): not a row not run or pending."""
    prov = rec.get("provenance") or {}
    return bool(prov.get("code") or prov.get("commit"))


def another_code(rec: Record, base: Record) -> bool:
    """Whether `rec` was made by another code than `base`. Records that name their cells' files (provenance.code_files,
    suite.core.cell_code) are of one code where every file both cells load is alike (the harness they share; each
    method's own files are its own). Else their code digests differ, or, where either predates the digest, their
    commits do. A record that names neither (not run, pending) is of no code."""
    mine, theirs = rec.get("provenance") or {}, base.get("provenance") or {}
    a, b = mine.get("code_files"), theirs.get("code_files")
    if isinstance(a, dict) and isinstance(b, dict):
        return any(a[f] != b[f] for f in a.keys() & b.keys())
    if mine.get("code") and theirs.get("code"):
        return mine["code"] != theirs["code"]
    return bool(mine.get("commit") and theirs.get("commit")) and mine["commit"] != theirs["commit"]


def commit_of(rec: Record) -> str:
    """A record's commit, short, or its code digest where it names no commit."""
    prov = rec.get("provenance") or {}
    return str(prov.get("commit") or "")[:7] or f"code {prov.get('code') or '?'}"


def codes(records: list[Record | None]) -> dict[int, str]:
    """The code of each record that names one (by its index in `records`), as a reader tells them apart: records of
    one code (another_code says none differs) share a label, its commit, and the code's digest beside where two codes
    share a commit (a dirty tree). One label each: every reader that marks codes (a claim, an excerpt, a verdict's
    doubts) says the same."""
    groups: list[list[int]] = []
    for i, rec in enumerate(records):
        if not rec or not made_by_a_code(rec):
            continue
        # (one code with every member: records that share a file with one member need not with another)
        home = next((g for g in groups if not any(another_code(rec, records[j]) for j in g)), None)
        if home is None:
            home = []
            groups.append(home)
        home.append(i)
    commits = ["/".join(sorted({commit_of(records[i]) for i in g})) for g in groups]  # one code, its commits
    out = {}
    for group, commit in zip(groups, commits):
        code = (records[group[0]].get("provenance") or {}).get("code")
        label = f"{commit} (code {code})" if commits.count(commit) > 1 and code else commit
        out.update(dict.fromkeys(group, label))
    return out


def measured(status: str, oom: bool = True) -> bool:
    """Whether a record's figures are shown: finished, or partial (the rounds measured before a call ended)."""
    s = status_of(status)
    return s.measured or (oom and s.kind == "oom")


def table_rows(exp, cells, records: list[Record | None]) -> tuple[list[str], list[list[Any]]]:
    """Column names and rows of one section; rate ratios only among rows of one sweep, and none of a row timed on a
    busy machine (a figure marks those withheld)."""
    base_idx = next((i for i, c in enumerate(cells) if c.row.name == exp.baseline), None)
    base_rec = records[base_idx] if base_idx is not None else None
    base_row = cells[base_idx].row if base_idx is not None else None
    flops, busy = has_flops(records), has_busy(records)
    rows = [_values(exp, c, rec, base_rec, base_row, flops, busy) for c, rec in zip(cells, records)]
    return [c.name for c in columns(exp, flops, busy)], rows


_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit|Expired)\b.*")


def reason(rec: Record) -> str:
    """One line on why a cell did not end `ok`: the exception's own line, else its status."""
    lines = [x.strip() for x in (rec.get("error") or "").strip().splitlines() if x.strip()]
    hits = [x for x in lines if _EXCEPTION_LINE.match(x)]
    if not hits and rec["status"] == "not_implemented" and lines:
        hits = lines[:1]  # recorded without running: the error is the reason, one line, no traceback
    return (hits[-1] if hits else rec["status"])[:200]


def _sweep_note(exp, cells, records) -> str:
    base = next((r for c, r in zip(cells, records) if c.row.name == exp.baseline), None)
    if not any(m.ratio for m in exp.metrics):
        return ""
    if base is None:
        return f"No `{exp.baseline}` record here, so no ratios."
    sweep = base.get("sweep")
    if sweep is None:
        return (
            f"Ratios are to the `{exp.baseline}` row, ours and the paper's. These records predate sweep ids: "
            "the ratios assume the rows came from one run, which the records cannot confirm."
        )
    others = [(c.row.name, r) for c, r in zip(cells, records) if r and r.get("sweep") != sweep]
    note = (
        f"Ratios are to the `{exp.baseline}` row, ours and the paper's; a rate's only among rows of one sweep (the "
        f"reference's here: `{sweep}`), a memory ratio among rows of one code whatever the sweep (load does not "
        "change what a step allocates)"
    )
    kept = [f"`{n}`" for n, r in others if r.get("reference")]
    lost = [f"`{n}`" for n, r in others if not r.get("reference")]
    if kept:
        note += (
            f"; {', '.join(kept)} came from earlier sweeps and take their rate ratios to the reference measured in "
            "their own (kept in runs/<machine>/earlier/)"
        )
    if lost:
        note += f"; {', '.join(lost)} came from other sweeps with no reference of theirs kept, and show no rate ratio"
    return note + "."


def _machine_line(records) -> str:
    fp = next((r["machine"] for r in records if r and isinstance(r.get("machine"), dict)), None)
    if fp and fp.get("cpu"):
        return f"Machine `{fp['slug']}`: {describe(fp)}."
    prov = next((r["provenance"] for r in records if r and r["provenance"]), {})
    return (
        f"Machine not fingerprinted: these records predate fingerprints; their provenance says "
        f"`{prov.get('device', '?')}`, host `{prov.get('host', '?')}`."
    )


def briefs(exp, cells, records: list[Record | None]) -> list[str]:
    """Each row's status as the compact table shows it (its flags' names; _status)."""
    base = next((r for c, r in zip(cells, records) if c.row.name == exp.baseline), None)
    return [_status(c, r, (r or {}).get("reference") or base, metrics_of(r))[1] for c, r in zip(cells, records)]


def units(exp, cells, records: list[Record | None]) -> dict[str, str]:
    """The one unit of each size metric in a section (size_unit over ours and the paper's values)."""
    return {
        m.key: size_unit([metrics_of(r).get(m.key) for r in records] + [c.row.paper.get(m.key) for c in cells])
        for m in exp.metrics
        if m.unit in SIZE_UNITS
    }


def _md_table(head: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(x) + " |" for x in lines)]


def compact_table(exp, cols: list[Column], rows: list[list[Any]], briefs: list[str]) -> list[str]:
    """The section's table in a minute: the row, what ran, the figures that answer the table's question with the
    paper's and the ratios (a rate's marked where it is within noise), status last (brief: its flags' names)."""
    names = [c.name for c in cols]
    shown = [i for i, c in enumerate(cols) if c.brief and c.name != "status"]
    lines = []
    for r, brief in zip(rows, briefs):
        line = []
        for i in shown:
            text = cols[i].show(r[i])
            noise = names[i].removesuffix(" ours") + " within noise"
            if names[i].endswith(" ours") and noise in names and r[names.index(noise)]:
                text += ", within noise"
            line.append(text)
        lines.append([*line, brief])
    return _md_table([cols[i].title for i in shown] + ["status"], lines)


def _notes(exp, records: list[Record | None]) -> list[str]:
    """The paragraphs on how to read a section that hold for every section of a page: the page says them once."""
    notes = []
    if any(spread(metrics_of(r), m.key) for r in records for m in exp.metrics):
        notes.append(
            "Throughput is the median of interleaved timing rounds (ABC ABC ABC); `within noise`: the "
            "row's and the baseline's min-max spreads overlap, so the ratio does not tell them apart."
        )
    if has_flops(records):
        notes.append(
            "TFLOPS: the model's training FLOPs per sample (three forwards' matmuls; a recompute's extra forward not "
            "counted: that is the record's `hardware_tflops`) times the throughput, as `suite/measure/flops.py` "
            "states it. MFU: TFLOPS over the device's dense peak, which each section's machine line names."
        )
    if has_busy(records):
        notes.append(
            "Device busy: the share of the median timed step's wall time in which the device computed, from the "
            "step's own trace (CUDA events); each record's `timeline` splits the rest into waits for an upload, a "
            "stash copy or the host, with the host's prepare and commit time and the prefetches that found their "
            "layer's update unfinished (methods/l2l/timeline.py). Not shown on a CPU, where the device is the host."
        )
    if any(r and status_of(r).kind == "partial" for r in records):
        notes.append(
            "`partial: k/n rounds`: the figures are those of the k rounds measured before the call that ran "
            "them ended (a GPU campaign stage at its deadline); the same command resumes the other rounds."
        )
    if any(r and (r.get("config") or {}).get("variant") for r in records):
        notes.append(
            "A variant's section (its title names the `--set` that changed what the rows run) shows the paper's "
            "values only beside its reference row, which runs as the table defines it."
        )
    told = next((metrics_of(r).get("not_counted") for r in records if metrics_of(r).get("not_counted")), None)
    if told:
        notes.append(f"Counted memory leaves out, each its own term on a GPU: {told}.")
    if exp.notes:
        notes.append(exp.notes)
    return notes


def section_head(exp, cells, records: list[Record | None], cols: list[Column], rows: list[list[Any]]) -> list[str]:
    """A section's lead, as its page and its W&B report show it: the machine line, the compact table and the note on
    what its ratios are to."""
    machine = _machine_line(records)
    if has_flops(records):
        peaks = sorted({metrics_of(r).get("peak_of") for r in records if "model_tflops" in metrics_of(r)} - {None})
        machine += f" MFU against the dense peak of {'; '.join(peaks) or 'the device'}."
    md = [machine, "", *compact_table(exp, cols, rows, briefs(exp, cells, records)), ""]
    note = _sweep_note(exp, cells, records)
    return md + ([note, ""] if note else [])


def render(exp, cells, records: list[Record | None], title: str) -> tuple[str, str, list[str]]:
    """Markdown and CSV text of one section of an experiment's table (its compact table, then every column, the
    counted memory and the provenance folded), and the notes on reading it that the page says once (_notes)."""
    flops, busy = has_flops(records), has_busy(records)
    cols = columns(exp, flops, busy, units(exp, cells, records))
    _, rows = table_rows(exp, cells, records)
    buf = io.StringIO()
    csv.writer(buf).writerows([[c.name for c in cols], *[[("" if v is None else v) for v in r] for r in rows]])
    md = [f"## {title}", "", *section_head(exp, cells, records, cols, rows)]
    md += contended_note(exp, cells, records)
    md += reference_note(exp, cells, records)
    md += exp.detail(cells, records) if exp.detail is not None else []
    md += ["<details><summary>Every column, the counted memory by role, and each row's provenance</summary>", ""]
    md += _md_table([c.title for c in cols], [[c.show(v) for c, v in zip(cols, r)] for r in rows]) + [""]
    md += counted_breakdown(cells, records)
    md += ["Provenance:", ""]
    for cell, rec in zip(cells, records):
        if not rec:
            md.append(f"- `{cell.row.name}`: not run")
            continue
        p = rec.get("provenance")
        if p is None:  # never started (not implemented, unavailable here): the machine it was recorded on
            md.append(
                f"- `{cell.row.name}` [{rec['status']}]: on {rec.get('machine', {}).get('slug', '?')}, "
                f"finished {rec.get('finished', '?')}, run `{rec.get('key')}` — {reason(rec)}"
            )
            continue
        desc = (
            f"- `{cell.row.name}` [{rec['status']}]: {p.get('device', '?')}, torch {p.get('torch', '?')}, "
            f"transformers {p.get('transformers', '?')}, commit {str(p.get('commit') or '?')[:10]}"
            f"{' (dirty)' if p.get('dirty') else ''}, cap {_cap(p.get('device_memory_cap_gb'))}, "
            f"threads {p.get('threads', '?')}, memory: {metrics_of(rec).get('memory_kind', '—')}, "
            f"rounds {rec.get('rounds', 1)}, finished {rec.get('finished', '?')}, run `{rec.get('key')}`"
        )
        if rec["status"] != "ok":
            desc += f" — {reason(rec)}"
        md.append(desc)
    md += ["", "</details>", ""]
    return "\n".join(md) + "\n", buf.getvalue(), _notes(exp, records)


def rerun_command(experiment: str, profile: str, rows: list[str], settings: list[str] = ()) -> str:
    """The command that measures `rows` again (with their reference row, suite.core.plan) as they were measured:
    their `settings` (SweepRequest.settings: a cap, --set overrides) included."""
    flags = " ".join([shlex.quote(f) for f in settings] + [f"--only {shlex.quote(r)}" for r in rows])
    return f"{paths.DOCUMENTED_SUITE} run {experiment} --profile {profile} {flags} --force"


def contended_command(experiment: str, profile: str, settings: list[str] = ()) -> str:
    """The one short command that measures a section's contended rows again, with their reference, as they were
    measured (their settings), leaving every other row (suite run --contended)."""
    flags = "".join(f" {shlex.quote(f)}" for f in settings)
    return f"{paths.DOCUMENTED_SUITE} run {experiment} --profile {profile}{flags} --contended"


def reference_note(exp, cells, records: list[Record | None]) -> list[str]:
    """Where the reference row failed (an error, a timeout), what that takes from the section (every ratio to it)
    and the command that measures it again with the rows whose ratios it gives."""
    ref = next(((c, r) for c, r in zip(cells, records) if c.row.name == exp.baseline), None)
    if ref is None or ref[1] is None or status_of(ref[1]).kind not in ("error", "timeout"):
        return []
    cell, rec = ref
    rows = [c.row.name for c, r in zip(cells, records) if r is not None]
    rerun = rerun_command(exp.name, cell.profile, rows, rec.get("settings") or [])
    return [
        f"The reference row `{exp.baseline}` is `{status_of(rec).kind}` here, so this section shows no ratio to it. "
        f"To measure it again with the rows beside it, in one sweep: `{rerun}`.",
        "",
    ]


def contended_note(exp, cells, records: list[Record | None]) -> list[str]:
    """What `contended` means in one short paragraph, the command that measures those rows again, and each row's
    reasons in one folded list (what the records' `metrics.contention` holds)."""
    busy = [(c, r) for c, r in zip(cells, records) if r and contended(metrics_of(r))]
    if not busy:
        return []
    names = ", ".join(f"`{c.row.name}`" for c, _ in busy)
    settings = next((r.get("settings") for _, r in busy if r.get("settings")), [])  # one section: one variant
    rerun = contended_command(exp.name, cells[0].profile, settings)
    details = [f"- `{c.row.name}`: {'; '.join(metrics_of(r)['contention']['reasons'])}" for c, r in busy]
    return [
        f"`contended` ({names}): the machine was busy while they were timed (the bounds: suite/measure/contention.py), "
        "so their rates may describe the machine, not the method: no rate ratio of theirs is shown (memory ratios "
        f"are). On an idle machine, `{rerun}` measures them again with their reference, and nothing else.",
        "",
        f"<details><summary>why each is contended ({len(busy)} rows)</summary>",
        "",
        *details,
        "",
        "</details>",
        "",
    ]


def _cap(gb: Any) -> str:
    return f"{gb} GB" if gb else "none"


def counted_breakdown(cells, records: list[Record | None]) -> list[str]:
    """Markdown lines splitting each counted record's peaks by role, device and host (none without counts)."""
    counted = [(c, r) for c, r in zip(cells, records) if r and "device_breakdown" in metrics_of(r)]
    if not counted:
        return []

    def gb(x) -> str:
        return "" if x is None else f"{x / 1e9:.3f}"

    head = ["row", "status", "device peak"] + [f"device {k}" for k in ROLES]
    head += ["host peak"] + [f"host {k}" for k in ROLES] + ["per counted rank (device)"]
    md = [
        "Counted memory by role (GB; at each place's peak; `stash`: activations kept for a backward, saved by "
        "autograd or held by the method's stash; `transient`: every other activation and temporary):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for cell, rec in counted:
        m = metrics_of(rec)
        dev, host = m.get("device_breakdown") or {}, m.get("host_breakdown") or {}
        line = [cell.row.name, rec["status"], gb(m.get("device_peak_allocated"))]
        line += [gb(dev.get(k)) for k in ROLES] + [gb(m.get("host_peak_bytes"))]
        line += [gb(host.get(k)) for k in ROLES]
        ranks = m.get("counted_ranks") or range(len(m.get("rank_memory", [])))
        line.append(" / ".join(f"{r}: {gb(b)}" for r, b in zip(ranks, m.get("rank_memory", []))))
        md.append("| " + " | ".join(line) + " |")
    return md + [""]


@contextmanager
def _definitions_only():
    """Rows as the definitions make them, not as one run's data folder does: a row that folder skipped would
    otherwise read `skipped` in every machine's section."""
    saved = os.environ.pop(paths.GLUE_DIR_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[paths.GLUE_DIR_ENV] = saved


def sections(exp, results_dir: Path, warn=print, variants: bool = True) -> list[tuple[str, list, list[dict | None]]]:
    """Every (machine, profile, device, variant) this experiment has records for, each with its rows in order;
    without `variants`, those of the table's own rows only, as its figures draw them: none of a sweep whose --set
    changed what its rows run (a method, a precision, an option: Experiment.variant_pairs)."""
    index = open_index(results_dir)
    groups: dict[tuple, dict[str, dict]] = {}
    for rec in index.records(warn):
        if rec.get("experiment") != exp.name or (not variants and (rec.get("config") or {}).get("variant")):
            continue
        key = (rec.get("profile"), machine_of(rec), rec.get("device_type"), rec.get("variant") or "")
        prev = groups.setdefault(key, {}).get(rec["row"])
        if prev is None or rec.get("finished", "") >= prev.get("finished", ""):
            groups[key][rec["row"]] = rec
    order = {"paper": 0, "small": 1, "tiny": 2}
    out = []
    for (profile, machine, dev, variant), by_row in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0][1].startswith("unfingerprinted"), kv[0][1:])
    ):
        with _definitions_only():
            rows = {r.name: r for r in exp.rows(profile)}
        cells, records = [], []
        base = by_row.get(exp.baseline)
        for name, row in rows.items():
            rec = by_row.get(name)
            if rec and base and rec.get("sweep") and rec["sweep"] != base.get("sweep") and name != exp.baseline:
                # a row of an earlier sweep takes its ratios to that sweep's reference, where one was kept
                ref = next(iter(index.kept(base["key"], machine, rec["sweep"])), None)
                if ref is not None and (why := suspect(ref, index.history(ref))):
                    ref = {**ref, "suspect": why}  # a suspect reference of that sweep gives no ratio either
                rec = {**rec, "reference": ref} if ref is not None else rec
            if rec and (why := suspect(rec, index.history(rec))):
                rec = {**rec, "suspect": why}  # shown with its reason; no ratio, bar or verdict rests on it
            run = RunConfig.from_dict(rec["config"]["run"]) if rec else RunConfig(method=row.method)
            if rec and exp.held_to is not None and status_of(rec).kind == "ok":  # against today's records
                rec = {**rec, "metrics": {**rec["metrics"], **exp.held_to(run, rec["metrics"], index)}}
            cells.append(Cell(exp.name, row, run, profile))
            records.append(rec)
        out.append((section_title(profile, machine, dev, variant), cells, records))
    return out


def labels_of(exp, cell: Cell, rec: Record | None) -> dict[str, Any]:
    """A row's labels: its definition's, with those that follow from what ran (Experiment.labels_of) taken from the
    record's own run config where it has one (a variant's --set changes them)."""
    if rec is None or exp.labels_of is None:
        return cell.row.labels
    return {**cell.row.labels, **exp.labels_of(cell.run)}


def section_title(profile: str, machine: str, device: str, variant: str = "") -> str:
    """A section's title: its profile, machine, device and variant (what a record's own fields name)."""
    return f"{profile} profile on {machine} ({device} device)" + (f", {variant}" if variant else "")


def anchor(title: str) -> str:
    """The link anchor a Markdown viewer (GitHub's) gives a `## title` heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def write_tables(exp, results_dir: Path) -> tuple[Path, Path]:
    """results/<experiment>.md and .csv, one section per machine, profile, device and variant with records: the page
    leads with its title, source and sections, each section with its compact table, and says its notes once."""
    parts, csv_rows, notes = [], [], {}
    secs = sections(exp, results_dir)
    for title, cells, records in secs:
        md, csv_text, said = render(exp, cells, records, title)
        parts.append(md)
        notes.update(dict.fromkeys(said))
        header, *lines = list(csv.reader(io.StringIO(csv_text)))
        csv_rows += [{"section": title, **dict(zip(header, line))} for line in lines]
    md_path, csv_path = results_dir / f"{exp.name}.md", results_dir / f"{exp.name}.csv"
    head = [f"# {exp.title}", "", f"Source: {exp.source}", ""]
    if not parts:  # no records on any machine: a page that says so, never an empty file
        page = head + [f"No records yet, on any machine: `{paths.DOCUMENTED_SUITE} run {exp.name}` measures them.", ""]
    else:
        head += [
            "Generated from results/runs/ by `python -m suite run`; do not edit by hand. Each section (a machine, "
            "profile and device) leads with its compact table; every column, the counted memory by role and each "
            "row's provenance are folded below it"
            + ("; the notes on reading them are at the end ([Notes](#notes))." if notes else "."),
            "",
        ]
        if len(secs) > 1:  # the sections, each a link
            head += [f"Sections ({len(secs)}):", "", *[f"- [{t}](#{anchor(t)})" for t, _, _ in secs], ""]
        page = head + parts + (["## Notes", "", *(x for n in notes for x in (n, ""))] if notes else [])
    write_atomic(md_path, "\n".join(page).rstrip("\n") + "\n")
    # One tidy table a program reads: every section's columns, in the order they first appear, each row blank where
    # its section has no such column (sections differ: TFLOPS and MFU on a GPU, device busy where it was read).
    names = list(dict.fromkeys(k for row in csv_rows for k in row)) or ["section"]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=names, restval="")
    writer.writeheader()
    writer.writerows(csv_rows)
    write_atomic(csv_path, buf.getvalue())
    return md_path, csv_path
