"""A sweep's plan, made before anything runs: its cells, and of them which are reused, which are recorded without
running and why, which resume measured rounds, and which run."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from suite.config.errors import ConfigError
from suite.core import registry
from suite.core.cell import check_cells
from suite.core.experiment import Cell
from suite.core.kinds import is_timed
from suite.core.request import SweepRequest
from suite.core.rounds import resumable
from suite.measure.provenance import code_digest
from suite.measure.step import METHODOLOGY_VERSION
from suite.records import store
from suite.records.schema import Outcome, Record, failed

COUNTABLE = "projected"  # besides the timed kinds: a planner's projection of a method the count can run instead


def counted(cells: list[Cell]) -> list[Cell]:
    """The cells as `count` cells: memory counted on fake tensors, one round each, their own cache keys. A
    projected pipeline row becomes a count of the method itself, each stage as its own rank would hold it; a
    projection of a system no method runs (inter-layer MP) has no count and is left out; a projection's search
    for the largest model becomes a search over counts (`count-search`, in the pipeline planner)."""
    wrong = sorted({c.kind for c in cells if not is_timed(c.kind) and c.kind != COUNTABLE})
    if wrong:
        raise ConfigError(
            f"--measure count counts the memory of a method's step; this experiment's {wrong} cells cannot be "
            "counted (accepted: experiments of throughput or projected cells, e.g. table2-table6, 2bw-fig7)"
        )
    out = []
    for c in cells:
        run = c.run
        if c.kind == COUNTABLE:
            options = {k: v for k, v in run.options.items() if k != "projection"}
            if run.options.get("projection", {}).get("method") not in (None, run.method):
                continue
            if run.options["projection"].get("search") == "max_layers":  # the largest model that fits: counts decide
                run = dataclasses.replace(run, options={**run.options, "executor": "dist"})
                out.append(dataclasses.replace(c, run=run, kind="count-search", timeout=max(c.timeout, 1800.0)))
                continue
            run = dataclasses.replace(run, options={**options, "executor": "dist"})
        out.append(dataclasses.replace(c, run=run, kind="count", timeout=max(c.timeout, 900.0)))
    return out


def expand(req: SweepRequest) -> list[Cell]:
    """The request's cells (as counts when it counts), every method constraint checked before any process starts;
    across nodes, every multi-rank cell must split evenly over them."""
    exp = req.experiment
    only = req.only
    if only and any(m.ratio for m in exp.metrics) and exp.baseline not in only:
        only = [exp.baseline, *only]  # the reference row, measured again if the rows it is a ratio for are (plan)
    if req.measure == "count":
        cells = counted(exp.cells(req.profile, only, req.overrides, req.device_memory, counting=True))
    else:
        cells = exp.cells(req.profile, only, req.overrides, req.device_memory)
    check_cells(cells)
    if not req.nodes.multi:
        return cells
    for c in cells:
        if c.world > 1:
            req.nodes.ranks_per_node(c.world, f"{c.experiment}/{c.row.name}: ")
    return [dataclasses.replace(c, nnodes=req.nodes.nnodes) for c in cells]


def new_sweep_id() -> str:
    """A sweep's id: when it started and a random tail (two sweeps in one second still differ)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def not_run_reason(cell: Cell, measure: str) -> str | None:
    """Why `cell` is recorded `not_implemented` without running: its row's method not registered yet, the
    method's library missing here, or a count it cannot take; None when it runs."""
    if not registry.is_registered(cell.row.method):
        return f"method {cell.row.method!r} is not registered yet"
    cls = registry.get(cell.run.method)
    if (why := cls.unavailable()) is not None:
        return f"unavailable here: {why}"
    return f"not counted: {cls.uncounted}" if measure == "count" and cls.uncounted else None


@dataclass
class Plan:
    """What a sweep does with each of its cells, in their order."""

    sweep: str  # the sweep's id: a new one, or the one a resumed partial record began in
    tags: dict[str, str] = field(default_factory=dict)  # how progress lines name each cell
    reused: dict[str, Record] = field(default_factory=dict)  # finished on this machine: kept as they are
    not_run: dict[str, str] = field(default_factory=dict)  # recorded `not_implemented`, with why
    resumed: dict[str, list[Outcome]] = field(default_factory=dict)  # rounds a partial record had measured
    complete: list[Cell] = field(default_factory=list)  # resumed with every round asked for: finished as they stand
    todo: list[Cell] = field(default_factory=list)  # to measure (after their resumed rounds)
    twins: dict[str, Outcome] = field(default_factory=dict)  # another table's finished record of the same cell
    aside: dict[str, list[dict]] = field(default_factory=dict)  # a resumed cell's rounds set aside by earlier calls
    # Cells with a record of their own here before this call: an interrupt never writes over one, and under --force
    # one is replaced only by its complete successor (suite.core.runner.Rounds)
    own: set[str] = field(default_factory=set)
    untouched: dict[str, Outcome] = field(default_factory=dict)  # a newer suite's record: neither read nor replaced


def same_as(req: SweepRequest, cell: Cell, machine: str) -> Outcome | None:
    """The outcome this cell gets from its row's twin (Row.same_as) when its cell runs this very config: the twin's
    record on this machine with its status (ok, oom, an error: the twin's own verdict), its metrics adapted; where
    the twin has none yet, or an unfinished one (partial, pending), a `pending` outcome naming it (the row is that
    cell, never measured as itself: suite.sweep.twins_first measures the twin first, in its own table's sweep).
    None where the row is not its twin's cell and runs: another config, a count, or a sweep across nodes (whose
    records are its own)."""
    if cell.row.same_as is None or req.measure != "time" or req.nodes.multi:
        return None
    from suite.core.experiment import get_experiment

    experiment, row = cell.row.same_as
    twins = get_experiment(experiment).cells(req.profile, [row], list(req.overrides or []), req.device_memory)
    if len(twins) != 1 or twins[0].run != cell.run:
        return None
    twin = {"experiment": experiment, "row": row, "key": twins[0].key}
    rec = store.load(req.results_dir, twins[0].key, machine)
    if rec is None or str(rec["status"]).startswith(("partial", "pending")):
        state = rec["status"] if rec is not None else "no record"
        why = f"the same cell as {experiment}/{row}, not finished on {machine} ({state}): measured there, read here"
        return {**failed(f"pending: {why}"), "reused_from": twin}
    adapt = cell.row.adapt or (lambda m: m)
    keep = ("status", "provenance", "rounds", "duration_s", "error")
    return {
        **{k: rec[k] for k in keep if k in rec},
        "metrics": adapt(dict(rec["metrics"])),
        "reused_from": {**twin, "sweep": rec.get("sweep")},
    }


def plan(req: SweepRequest, cells: list[Cell], machine: str, progress: Callable[[str], None]) -> Plan:
    """Decide, from this machine's records (never another's) and the method registry, what becomes of each cell;
    reports each reused one."""
    p = Plan(new_sweep_id())
    for i, cell in enumerate(cells, 1):
        name = f"{req.experiment.name}/{cell.row.name}"
        p.tags[cell.key] = f"[{i}/{len(cells)}] {name} ({cell.row.method}, {req.profile})"
        cached = store.load(req.results_dir, cell.key, machine, warn=progress)
        if cached is not None:
            p.own.add(cell.key)
        elif (version := store.newer_here(req.results_dir, cell.key, machine)) is not None:
            why = f"its record here was written by a newer suite (schema {version}): left untouched, not measured"
            p.untouched[cell.key] = failed(f"error: {why}")
            progress(f"{p.tags[cell.key]}: {why}")
            continue
        kept = [] if req.force else resumable(cached, METHODOLOGY_VERSION, code_digest())
        if kept:
            p.resumed[cell.key] = kept
            if aside := cached["metrics"].get("rounds_set_aside"):  # what earlier calls set aside stays in evidence
                p.aside[cell.key] = list(aside)
            p.sweep = cached.get("sweep") or p.sweep  # the rounds go on in the sweep they began in
        elif cached and str(cached["status"]).startswith("pending") and not req.force:
            p.sweep = cached.get("sweep") or p.sweep  # a sweep interrupted or cut before this cell ran: it goes on
        twin = same_as(req, cell, machine)  # forced too: suite.sweep.twins_first has run the twin's sweep
        if twin is not None:
            of = f"{twin['reused_from']['experiment']}/{twin['reused_from']['row']}"
            waits = twin["status"].startswith("pending")
            said = "waits for " + of if waits else f"the same cell as {of} on {machine}, reused"
            progress(f"{p.tags[cell.key]}: {twin['status'].split(':')[0]} ({said})")
            p.twins[cell.key] = twin
        elif cached and cached["status"] in store.FINISHED and not req.force:
            progress(f"{p.tags[cell.key]}: {cached['status']} (cached on {machine}, {cell.key})")
            p.reused[cell.key] = cached
        elif (why := not_run_reason(cell, req.measure)) is not None:
            p.not_run[cell.key] = why
        elif len(kept) >= req.planned_rounds(is_timed(cell.kind)):
            p.complete.append(cell)
        else:
            p.todo.append(cell)
    _with_reference(req, cells, p, progress)
    return p


def _with_reference(req: SweepRequest, cells: list[Cell], p: Plan, progress: Callable[[str], None]) -> None:
    """Rows measured in this sweep take their ratios to the experiment's reference row only within one sweep: a
    reference finished in another sweep is measured again beside them, first in each round, so that they carry
    ratios (a subset re-run with --only, a cell re-measured after a corrupt record). The rows reused from that
    other sweep then show none, and the table says so."""
    exp = req.experiment
    if not p.todo or not any(m.ratio for m in exp.metrics):
        return
    ref = next((c for c in cells if c.row.name == exp.baseline), None)
    if ref is None or ref.key not in p.reused or p.reused[ref.key].get("sweep") == p.sweep:
        return
    del p.reused[ref.key]
    p.todo.insert(0, ref)
    progress(f"{p.tags[ref.key]}: measured again, beside the rows of sweep {p.sweep} that take their ratios to it")
