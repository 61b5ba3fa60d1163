"""Figures outside a table: the README's and docs pages' generated excerpts, each a few rows and columns of one
section of a results table, written from the records by `python -m suite render` and never typed by hand.

A page asks for one with a marker whose spec names the section as its table titles it, the rows (all where left
out) and the columns (the CSV's names); the body between the markers is the render's:

    <!-- excerpt: generated from results/runs/ by `python -m suite render`; do not edit by hand; {"experiment":
    "table3", "section": "paper profile on h100-79gb (cuda device)", "rows": ["l2l-cmp-u1"], "columns": ["..."]} -->
    <!-- excerpt: end -->

(the opening marker on one line). The excerpt names its machine, profile, what its figures are (measured, counted,
projected) and the code of each row; rows of several codes say so row by row, and the status column carries every
mark its table gives (contended, suspect, another code, fewer rounds).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from suite.config.errors import ConfigError
from suite.config.files import write_atomic
from suite.core.experiment import get_experiment
from suite.core.kinds import KINDS, is_projected, kind
from suite.records.schema import metrics_of
from suite.report import tables

NAME = "excerpt"
MARK = "generated from results/runs/ by `python -m suite render`; do not edit by hand"
BLOCK = re.compile(
    rf"(?P<open><!-- {NAME}: {re.escape(MARK)}; (?P<spec>\{{[^\n]*\}}) -->\n)"
    rf"(?P<body>.*?)(?P<end><!-- {NAME}: end -->)",
    re.S,
)


def _kind(rec) -> str:
    """What a record's figures are: projected (a projection's arithmetic), counted (fake tensors on the host: a count,
    a search over counts), else measured."""
    name = ((rec or {}).get("config") or {}).get("kind") or "throughput"
    if is_projected(name):
        return "projected"
    return "counted" if name in KINDS and kind(name).on_host else "measured"


def render(spec: dict, results_dir: Path, page: Path) -> str:
    """The body of one excerpt (see the module): a caption line, then its table."""
    exp = get_experiment(spec["experiment"])
    found = [s for s in tables.sections(exp, results_dir, warn=lambda _: None) if s[0] == spec["section"]]
    if not found:
        raise ConfigError(f"{page.name}: excerpt of {exp.name}: no section titled {spec['section']!r}")
    title, cells, records = found[0]
    cols = tables.columns(exp, tables.has_flops(records), tables.has_busy(records), tables.units(exp, cells, records))
    names = [c.name for c in cols]
    _, rows = tables.table_rows(exp, cells, records)
    briefs = tables.briefs(exp, cells, records)
    want = spec.get("rows") or [c.row.name for c in cells]
    by_row = {c.row.name: i for i, c in enumerate(cells)}
    missing = [r for r in want if r not in by_row] + [c for c in spec.get("columns", []) if c not in names]
    if missing:
        raise ConfigError(f"{page.name}: excerpt of {exp.name}: no row or column {', '.join(map(repr, missing))}")
    picked = [by_row[r] for r in want]
    shown = [names.index(c) for c in spec.get("columns", []) if c != "status"]  # the status (brief) comes last
    labels = tables.codes([records[i] for i in picked])  # by position among the picked rows
    commits = sorted(set(labels.values()))
    several = len(commits) > 1
    head = ["row", *(cols[i].title for i in shown), *(["code"] if several else []), "status"]
    lines = []
    for n, i in enumerate(picked):
        line = [cells[i].row.name, *(cols[j].show(rows[i][j]) for j in shown)]
        if several:
            line.append(labels.get(n, "—"))
        lines.append([*line, briefs[i]])
    kinds = sorted({_kind(records[i]) for i in picked if records[i] and metrics_of(records[i])})
    link = os.path.relpath(results_dir / f"{exp.name}.md", page.parent).replace(os.sep, "/")
    code = (
        f"rows of several codes (each row's named): {', '.join(commits)}"
        if several
        else "code " + (commits[0] if commits else "none")
    )
    caption = (
        f"From [{exp.name}]({link}#{tables.anchor(title)}): {title}; {' and '.join(kinds) or 'no figures'}; {code}."
    )
    return "\n".join([caption, "", *tables._md_table(head, lines)]) + "\n"


def rewrite(text: str, results_dir: Path, page: Path) -> str:
    """`text` with every excerpt's body rendered again from the records."""

    def one(m: re.Match) -> str:
        try:
            spec = json.loads(m["spec"])
        except ValueError as exc:
            raise ConfigError(f"{page.name}: an excerpt's spec is not JSON ({exc}): {m['spec']}") from None
        return m["open"] + render(spec, results_dir, page) + m["end"]

    return BLOCK.sub(one, text)


def write_pages(results_dir: Path, pages: list[Path]) -> list[Path]:
    """Render every excerpt of `pages` again; returns the pages whose text changed."""
    written = []
    for page in pages:
        text = page.read_text()
        new = rewrite(text, Path(results_dir), page)
        if new != text:
            write_atomic(page, new)
            written.append(page)
    return written
