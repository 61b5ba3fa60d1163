"""The README's claims at a glance: each paper claim beside what our records show, rendered between two markers."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite.config.files import write_atomic
from suite.report import tables
from suite.report.reading import Reading, Where, read

BEGIN = "<!-- claims: generated from results/runs/ by `python -m suite render`; do not edit by hand -->"
END = "<!-- claims: end -->"
CLAIMS_MODULE = "experiments.claims"  # found by name: the report stands below the experiments
SEE = "see"  # a verdict no rule computes: the table's link stands in its place


@dataclass(frozen=True)
class Finding:
    """What one section of records shows for a claim: our figures, and the verdict its rule gives."""

    ours: str
    verdict: str


@dataclass(frozen=True)
class Claim:
    """A paper's claim, the section of records that tests it, and `judge`: our figures and the verdict, by a
    rule fixed in code. `table` is the results page to read it in (default: the experiment's own)."""

    text: str
    paper: str
    figure: str
    where: Where
    judge: Callable[[Reading], Finding]
    table: str = ""

    @property
    def link(self) -> str:
        page = self.table or f"{self.where.experiment}.md"
        return f"[{page.removesuffix('.md')}](results/{page})"


def load_claims() -> list[Claim]:
    """The claim definitions, `CLAIMS` of the package experiments/claims/."""
    return list(importlib.import_module(CLAIMS_MODULE).CLAIMS)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(claims: list[Claim], results_dir: Path) -> str:
    """The markdown table, one line per claim, read from the records under `results_dir`."""
    cache: dict[Any, Reading | None] = {}
    lines = [
        "| claim | paper | ours | machine | verdict | table |",
        "|---|---|---|---|---|---|",
    ]
    for c in claims:
        if c.where not in cache:
            cache[c.where] = read(c.where, Path(results_dir))
        reading = cache[c.where]
        if reading is not None:
            reading.used.clear()  # what this claim reads, not what the claims before it on the section read
        found = c.judge(reading) if reading is not None else Finding("no records", "not run")
        verdict = provisional(f"see {c.link}" if found.verdict == SEE else found.verdict, reading)
        ours = found.ours + (codes_read(reading) if reading is not None else "")
        where = reading.where if reading is not None else c.where  # the machine read (ANY_CPU: the one chosen)
        cells = [c.text, f"{c.paper}: {c.figure}", ours, where.label(), verdict, c.link]
        lines.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    return "\n".join(lines) + "\n"


def codes_read(reading: Reading) -> str:
    """Where the rows a claim read come from more than one code, each row's code, so that no figures of two codes
    stand side by side unmarked (` [rows: code; ...]`); else ""."""
    rows = sorted({row for row, _ in reading.used if reading.records.get(row)})
    labels = tables.codes([reading.records[row] for row in rows])
    commits = {rows[i]: label for i, label in labels.items()}
    if len(set(commits.values())) < 2:
        return ""
    by_commit: dict[str, list[str]] = {}
    for row, commit in commits.items():
        by_commit.setdefault(commit, []).append(f"`{row}`")
    if len(commits) > MARKED_ROWS:  # a claim over many rows (Table 7's tasks and seeds): how many rows each code made
        return " [rows of several codes: " + ", ".join(f"{c} {len(r)}" for c, r in sorted(by_commit.items())) + "]"
    return " [" + "; ".join(f"{', '.join(rows)}: {commit}" for commit, rows in sorted(by_commit.items())) + "]"


MARKED_ROWS = 6  # up to this many rows, each row's code is named; beyond, each code's count of rows


UNDECIDED = ("pending", "not run", "untested", "see ")  # verdicts that claim nothing: no doubt to add


def provisional(verdict: str, reading: Reading | None) -> str:
    """`verdict`, or `provisional (verdict): why` where what the claim read is in doubt (Reading.doubts): a
    suspect row, rows of several codes, a rate of fewer than 3 rounds. Such a verdict is never `reproduced`. An
    undecided verdict (pending, not run) claims nothing, and keeps the doubts of the figures printed beside it."""
    why = reading.doubts() if reading is not None else []
    if not why:
        return verdict
    if verdict.startswith(UNDECIDED):  # it claims nothing, yet the figures beside it keep their doubts
        return f"{verdict} ({'; '.join(why)})"
    return f"provisional ({verdict}): {'; '.join(why)}"


def block(results_dir: Path, claims: list[Claim] | None = None) -> str:
    """The generated block, markers included."""
    return f"{BEGIN}\n{render(load_claims() if claims is None else claims, results_dir)}{END}"


def replace_block(text: str, new_block: str) -> str:
    """`text` with the part between the markers (markers included) replaced by `new_block`."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError("no claims markers found")
    return pattern.sub(lambda _: new_block, text, count=1)


def committed_block(text: str) -> str:
    """The block as it stands in `text` (markers included)."""
    found = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    if found is None:
        raise ValueError("no claims markers found")
    return found.group(0)


def write_readme(results_dir: Path, readme: Path | None = None) -> Path | None:
    """Rewrite the claims block of the README beside `results_dir` (no README with the markers: nothing written)."""
    readme = Path(readme or Path(results_dir).parent / "README.md")
    text = readme.read_text() if readme.exists() else ""
    if BEGIN not in text:
        return None
    new = replace_block(text, block(results_dir))
    if new != text:
        write_atomic(readme, new)
    return readme
