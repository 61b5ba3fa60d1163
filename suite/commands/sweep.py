"""Regenerate one experiment: run (or reuse) its cells, then write its tables, figure and W&B table."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from suite.config import paths
from suite.config.files import write_atomic
from suite.core.experiment import Experiment
from suite.core.request import SweepRequest
from suite.core.runner import run_cells
from suite.measure.contention import contended
from suite.records import tracking
from suite.records.index import open_index
from suite.records.schema import Record
from suite.report import tables
from suite.report.wandb_export import export


def sweep(req: SweepRequest, progress=print) -> list[Record]:
    """Run (or reuse) every cell `req` asks for, write its records, tables, figure and W&B runs; returns the records.
    Across nodes, node 0 does all of that; the others run their share of its multi-rank cells and return []."""
    before = _as_they_stand(req)  # what this call finds: a record it leaves as it was is not fresh
    pairs = run_cells(req, progress, twins=lambda due: twins_first(req, due, progress))
    if req.follower:
        return []  # node 0 writes the tables
    cells, records = [c for c, _ in pairs], [r for _, r in pairs]
    exp = req.experiment
    render(exp, req.results_dir, progress)
    mine = next((r for r in records if r and r.get("machine")), None)
    if mine is not None:  # where this call's rows are among the page's sections (each machine's, each variant's)
        title = tables.section_title(mine["profile"], mine["machine"]["slug"], mine["device_type"], mine["variant"])
        progress(f"this machine's rows: section '{title}' of {req.results_dir / (exp.name + '.md')}")
    busy = [c.row.name for c, r in zip(cells, records) if r and contended(r.get("metrics") or {})]
    if busy:  # never silent: one line naming them and the command that measures them again
        rerun = tables.contended_command(exp.name, cells[0].profile, req.settings)
        progress(
            f"contended (the machine was busy while they were timed; their ratios are not shown): "
            f"{', '.join(busy)}; on an idle machine: {rerun}"
        )
    # what this call measured or saved anew (never by the clock: a record finished in the second this call started
    # is not this call's; a second sweep at once reused it and logged its table again)
    fresh = [r for r in records if r.get("sweep") and _stamp(r) not in before]
    if not fresh:  # nothing measured by this call: its runs and its table run would repeat the sweep's own
        return records
    ids = {tracking.run_id(r) for r in fresh}
    try:  # each record this call saved, as `suite wandb` exports it, with its row's ratios and marks
        export(req.results_dir, req.wandb_mode, [exp], where=lambda r: tracking.run_id(r) in ids,
               progress=progress, warn=lambda _: None)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 — the records and tables are on disk; W&B must not fail the sweep
        progress(f"W&B logging failed: {exc} (the records stand; `{paths.DOCUMENTED_SUITE} wandb` logs them later)")
    cols, rows = tables.table_rows(exp, cells, records)
    prov = fresh[-1].get("provenance") or {}
    config = {
        "experiment": exp.name,
        "title": exp.title,
        "profile": cells[0].profile,
        "machine": (fresh[-1].get("machine") or {}).get("slug"),
        "sweep": fresh[-1]["sweep"],
        "commit": prov.get("commit"),
        "baseline": exp.baseline,
        "rounds": req.rounds,
        "base": exp.base(cells[0].profile),
        "contended_rows": [c.row.name for c, r in zip(cells, records) if r and contended(r.get("metrics") or {})],
    }
    try:
        table = tracking.log_table(
            experiment=exp.name, columns=cols, rows=rows, mode=req.wandb_mode, config=config,
            dir=tracking.folder(req.results_dir),
        )  # fmt: skip
        if table is not None:  # counted apart from the records' runs: the console counts every run it wrote
            progress(f"W&B: and one run of the sweep's table ({Path(table).name})")
    except Exception as exc:  # noqa: BLE001 — the table is already on disk; W&B must not fail the sweep
        progress(f"W&B table logging failed: {exc}")
    return records


def _stamp(record: Record) -> str:
    return json.dumps(record, sort_keys=True, default=str)


def _as_they_stand(req: SweepRequest) -> set[str]:
    """The experiment's records in the results folder before a call, each as a stamp of its whole content."""
    index = open_index(req.results_dir)
    return {_stamp(r) for r in index.records(warn=lambda _: None) if r.get("experiment") == req.experiment.name}


def twins_first(req: SweepRequest, due: dict[str, list[str]], progress=print) -> None:
    """Rows that are another table's cell (Row.same_as: Table 4's one-rank rows are Table 3's L2L-CMP cells) are that
    cell, never measured twice: the twins the plan finds due (Plan.twins_due: not finished on this machine, or all
    under --force) are measured, resumed or retried by their own table's sweep first, with this call's settings;
    this table then reads their records, whatever their status."""
    from suite.core.experiment import get_experiment

    for name, rows in due.items():
        progress(f"{req.experiment.name}: {', '.join(rows)} of {name} first (the same cells as rows of this table)")
        sweep(dataclasses.replace(req, experiment=get_experiment(name), only=tuple(rows)), progress)


def render(exp: Experiment, results_dir: Path | None = None, progress=print) -> list[Path]:
    """Write `exp`'s tables and figure from the records alone (nothing runs); returns the paths written."""
    results_dir = Path(results_dir or paths.RESULTS_DIR)
    md_path, csv_path = tables.write_tables(exp, results_dir)
    progress(f"wrote {md_path} and {csv_path}")
    written = [md_path, csv_path]
    figures = [Path(p) for p in (exp.figure(exp, results_dir) if exp.figure is not None else [])]
    for path in figures:
        progress(f"wrote {path}")
    for path in _figures_dropped(exp, results_dir, figures, progress):
        progress(f"removed {path} (its table no longer draws it)")
    return written + figures


def _figures_dropped(exp: Experiment, results_dir: Path, figures: list[Path], progress=print) -> list[Path]:
    """Remove the figures `exp`'s last render wrote and this one did not (a figure never shows what its table no
    longer does: a ratio whose reference failed, a section gone), per its list in results/figures/written/; before
    any list, those named `<experiment>_*.png` or `front_<experiment>_*.png`. Returns the paths removed."""
    folder = results_dir / "figures"
    listing = folder / "written" / f"{exp.name}.txt"
    try:
        named = [folder / n for n in listing.read_text().split("\n") if n]
    except FileNotFoundError:
        named = [*folder.glob(f"{exp.name}_*.png"), *folder.glob(f"front_{exp.name}_*.png")]
    before = {p for p in named if paths.inside(folder, p) and p.parent == folder and p.suffix == ".png"}
    for p in sorted(set(named) - before):  # a name that is no figure of the folder's: nothing of it removed
        progress(f"warning: {listing} names {p}, not a figure in {folder}: left as it is")
    now = {p.resolve() for p in figures}
    gone = sorted(p for p in before if p.resolve() not in now and p.exists())
    for p in gone:
        p.unlink()
    if figures or listing.exists():
        names = sorted(p.name for p in figures if p.parent.resolve() == folder.resolve())
        write_atomic(listing, "".join(f"{n}\n" for n in names))
    return gone
