"""A table page read in a minute (issue 53): each section leads with a compact table in words, one unit a quantity,
columns that do not apply blank, the paper's values only beside the rows that ran as the paper's, notes once a page."""

import re
from pathlib import Path

import pytest

from suite.core import registry
from suite.core.experiment import get_experiment
from suite.report import tables

RESULTS = Path(__file__).resolve().parents[1] / "results"
METHODS = set(registry.names())  # a method's name (grad_accum) is a word of a heading, not a record's field
MOST = 13  # "at most about a dozen" columns: the row, what ran, each figure with the paper's and the ratios, status


def _records(cells, variant=None):
    return [
        {
            "status": "ok",
            "sweep": "s",
            "device_type": "cpu",
            "provenance": {"code": "c"},
            "config": {"run": c.run.to_dict(), **({"variant": variant} if variant else {})},
            "metrics": {"throughput": 10.0 + i, "memory_gb": 0.004 + i / 1000},
        }
        for i, c in enumerate(cells)
    ]


def _tables(md: str) -> list[list[list[str]]]:
    """Every markdown table of a page, as rows of cells (the header first, the rule left out)."""
    out, rows = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            out, rows = [*out, rows], []
    return out


def test_a_section_leads_with_its_compact_table_in_words_and_one_unit():
    exp = get_experiment("table2")
    cells = exp.cells("tiny", None, None, None)
    md, _, notes = tables.render(exp, cells, _records(cells), "tiny profile on m (cpu device)")
    compact, full, *_ = _tables(md)
    head = compact[0]
    assert len(head) <= MOST and head[:2] == ["row", "method"] and head[-1] == "status"
    assert "memory (GB) ours" in head and "memory (GB) paper" in head  # the paper's unit: one for both columns
    assert "throughput ratio to baseline-fp32, ours" in head and not any("_" in h for h in head)  # words
    row = dict(zip(head, compact[1]))
    assert row["memory (GB) ours"] == "0.004" and row["memory (GB) paper"] == "10.51"  # the unit in the heading only
    every = dict(zip(full[0], full[1]))  # the folded table: every column, those that do not apply blank
    assert every["uBatch"] == "" and every["stash"] == "" and every["sweep"] == "s"
    assert "stash" in full[0] and dict(zip(full[0], full[3]))["stash"] == "device"  # the paper's l2l: not "gpu"
    assert exp.notes not in md and exp.notes in notes  # the page says its notes once (write_tables)
    assert md.index("<details>") > md.index(compact[-1][0])  # the compact table leads; the rest is folded


def test_a_variants_rows_show_no_paper_value_beside_what_the_variant_changed():
    exp = get_experiment("table2")
    cells = exp.cells("tiny", ["baseline-fp32", "l2l-cmp"], ["method=grad_accum"], None)
    md, _, notes = tables.render(exp, cells, _records(cells, "set method=grad_accum"), "tiny profile on m, variant")
    compact = _tables(md)[0]
    rows = {r[0]: dict(zip(compact[0], r)) for r in compact[1:]}
    assert rows["baseline-fp32"]["throughput (samples/s) paper"] == "16.52"  # the reference runs as defined
    assert rows["l2l-cmp"]["method"] == "grad_accum" and rows["l2l-cmp"]["throughput (samples/s) paper"] == "—"
    assert any("variant" in n for n in notes)


def test_a_size_column_reads_in_the_unit_of_its_largest_value():
    assert [tables.size_unit(v) for v in ([0.004, None], [0.004, 10.51], [2e-6], [1500.0], [])] == [
        "MB", "GB", "KB", "TB", "KB",
    ]  # fmt: skip


@pytest.mark.parametrize("page", sorted(p.name for p in RESULTS.glob("*.md")))
def test_every_committed_page_leads_each_section_with_a_compact_table(page):
    md = (RESULTS / page).read_text()
    if "<details><summary>Every column" not in md:
        pytest.skip(f"{page} is not a table of sections (a report of its own)")
    assert md.count("## Notes") <= 1 and md.count("Generated from results/runs/") == 1
    for section in re.split(r"^## ", md, flags=re.M)[1:]:
        if section.startswith("Notes"):
            continue
        compact = _tables(section)[0][0]
        assert len(compact) <= MOST, (section.splitlines()[0], compact)
        fields = [w for h in compact for w in re.findall(r"[\w-]+", h) if "_" in w and w not in METHODS]
        assert not fields and not any(re.search(r" x[\w-]+ (ours|paper)", h) for h in compact), compact  # in words
