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
from suite.core.schedule import by_shape
from suite.measure import sources
from suite.measure.contention import contended
from suite.measure.provenance import versions
from suite.measure.step import METHODOLOGY_VERSION
from suite.records.index import open_index
from suite.records.schema import Outcome, Record, failed, machine_of, status_of

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


def not_run_reason(cell: Cell, measure: str, unavailable: Callable[[Cell], str | None] | None = None) -> str | None:
    """Why `cell` is recorded `not_implemented` without running: its row's method not registered yet, the
    method's library missing where it runs (`unavailable`: that machine's answer, else this one's), or a count it
    cannot take; None when it runs."""
    if not registry.is_registered(cell.row.method):
        return f"method {cell.row.method!r} is not registered yet"
    cls = registry.get(cell.run.method)
    why = unavailable(cell) if unavailable is not None else cls.unavailable()
    if why is not None:
        return f"unavailable here: {why}" if unavailable is None else why
    return f"not counted: {cls.uncounted}" if measure == "count" and cls.uncounted else None


# What a plan decides for a cell, one of:
REUSED = "reused"  # finished on this machine: its record kept as it is
TWIN = "twin"  # another table's record of the same cell (Row.same_as), or `pending` until that one finishes
UNTOUCHED = "untouched"  # a newer suite's record: neither read nor replaced
NOT_RUN = "not run"  # recorded `not_implemented`, with why
PAST_CAP = "past its cap"  # counted past its device cap: recorded `oom` (counted) without running
COMPLETE = "complete"  # resumed with every round asked for: finished as it stands
RESUME = "resume"  # its measured rounds kept, the rest run
RUN = "run"  # measured in every round
STALE = "stale"  # a finished timed record of another code: measured again in every round (the old one kept aside)
LEFT = "left"  # not stale, under SweepRequest.stale == "only": left as it stands, nothing measured or written
RUNS = (RESUME, RUN, STALE)


@dataclass
class Decision:
    """What becomes of one cell: its `action`, why (a cell not run), the outcome it takes without running (a
    reused record, a twin's, a count past its cap), the rounds a partial record had measured, and the rounds it
    still runs."""

    cell: Cell
    action: str
    why: str = ""
    outcome: Outcome | None = None
    resumed: list[Outcome] = field(default_factory=list)
    rounds: int = 0


def due(done: int, planned: int, r: int, making_up: bool = False) -> bool:
    """Whether a cell with `done` rounds of `planned` runs one in pass `r`: while it has fewer than `r` (a cell
    resumed past this pass waits), and past the last pass only to make up rounds set aside (`making_up`)."""
    if r > planned and not making_up:
        return False
    return done < min(r, planned)


@dataclass
class Plan:
    """What a sweep does with each of its cells: one decision each, in the order they are taken (the reference row
    first where it is measured again), and each round's order of the cells that run."""

    sweep: str  # the sweep's id: a new one, or the one a resumed partial record began in
    rounds: int = 1  # the rounds a timed cell takes (SweepRequest.rounds)
    grouped: bool = False  # a round's cells grouped by model shape: the worker's pool builds each shape once
    decisions: list[Decision] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)  # how progress lines name each cell
    aside: dict[str, list[dict]] = field(default_factory=dict)  # a resumed cell's rounds set aside by earlier calls
    # Cells with a record of their own here before this call: an interrupt never writes over one, and under --force
    # one is replaced only by its complete successor (suite.core.runner.Rounds)
    own: set[str] = field(default_factory=set)

    def of(self, *actions: str) -> list[Decision]:
        return [d for d in self.decisions if d.action in actions]

    def twins_due(self, force: bool) -> dict[str, list[str]]:
        """The rows of other tables whose cells this sweep's twin rows are (Row.same_as) and that must be measured
        first, in their own table's sweep: each twin not finished on this machine (no record, partial, pending, or
        a status its table retries), or every one under --force; by experiment."""
        due: dict[str, list[str]] = {}
        for d in self.of(TWIN):
            if force or not status_of(d.outcome).finished:
                src = d.outcome["reused_from"]
                due.setdefault(src["experiment"], []).append(src["row"])
        return due

    @property
    def todo(self) -> list[Cell]:
        """The cells that run (after their resumed rounds), in the plan's order."""
        return [d.cell for d in self.of(*RUNS)]

    def planned(self, cell: Cell) -> int:
        return self.rounds if is_timed(cell.kind) else 1

    def order(self, cells: list[Cell], r: int) -> list[Cell]:
        """Round `r`'s cells in the order they run: the plan's, grouped by shape for the worker (schedule.by_shape)."""
        return by_shape(cells, r) if self.grouped else cells

    def passes(self) -> list[list[Cell]]:
        """Each pass's cells in order, where every round succeeds (the runner's own passes also make up rounds set
        aside, and stop a cell that failed): what an estimate prices."""
        done = {d.cell.key: len(d.resumed) for d in self.of(*RUNS)}
        out = []
        for r in range(1, self.rounds + 1):
            cells = self.order([c for c in self.todo if due(done[c.key], self.planned(c), r)], r)
            for c in cells:
                done[c.key] += 1
            out.append(cells)
        return out


def stale_reason(record: Record, cell: Cell) -> str | None:
    """Why a finished record is stale to this code: its cell's code (suite.core.cell_code: the files its engine, kind
    and method load) is not the code that measured it, or it recorded none; None where the cell's code now is the
    record's. What decides a timed record is the code that ran it: a record of another code is evidence of that code,
    not of this one, and is measured again (its old figures kept aside by the store: the index's `kept`)."""
    prov = record.get("provenance") or {}
    now = cell.code
    if prov.get("code") == now["code"]:
        return None
    commit = f" at {str(prov['commit'])[:7]}" if prov.get("commit") else ""
    said = f"measured by code {prov.get('code') or '(unrecorded)'}{commit}; this code is {now['code']}"
    was = prov.get("code_files")
    if not isinstance(was, dict):  # made before a record's code was its cell's (a digest of the whole tree)
        return f"{said} (it names no files: the whole tree's digest)" if prov.get("code") else said
    diff = sources.changed(was, now["code_files"])
    return f"{said} ({', '.join(diff[:3])}{f' and {len(diff) - 3} more' if len(diff) > 3 else ''} changed)"


def count_stale(record: Record) -> str | None:
    """Why a finished count is stale here: torch or transformers is not the version that made it (a count runs on
    fake tensors, so those decide it, with the cell's config in its key); None where both are the same."""
    prov = record.get("provenance") or {}
    made, now = (prov.get("torch"), prov.get("transformers")), versions()
    if made == now or made == (None, None):  # (a count that states none: an oom or error, no count to redo)
        return None
    return f"counted under torch {made[0]}, transformers {made[1]}; this is torch {now[0]}, transformers {now[1]}"


def same_as(req: SweepRequest, cell: Cell, machine: str) -> Outcome | None:
    """The outcome this cell gets from its row's twin (Row.same_as) when its cell runs this very config: the twin's
    record on this machine with its status (ok, oom, an error: the twin's own verdict), its metrics adapted; where
    the twin has none yet, or an unfinished one (partial, pending), a `pending` outcome naming it (the row is that
    cell, never measured as itself: the runner has the twin measured first, in its own table's sweep: twins_due).
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
    rec = open_index(req.results_dir).cell(twins[0].key, machine)
    old = rec is not None and req.stale != "keep" and (why := stale_reason(rec, twins[0])) is not None
    if rec is None or status_of(rec).unfinished or old:
        state = (f"stale: {why}" if old else rec["status"]) if rec is not None else "no record"
        why = f"the same cell as {experiment}/{row}, not finished on {machine} ({state}): measured there, read here"
        return {**failed(f"pending: {why}"), "reused_from": twin}
    adapt = cell.row.adapt or (lambda m: m)
    keep = ("status", "provenance", "rounds", "duration_s", "error")
    return {
        **{k: rec[k] for k in keep if k in rec},
        "metrics": adapt(dict(rec["metrics"])),
        "reused_from": {**twin, "sweep": rec.get("sweep")},
    }


def plan(
    req: SweepRequest,
    cells: list[Cell],
    machine: str,
    progress: Callable[[str], None],
    unavailable: Callable[[Cell], str | None] | None = None,
    past_cap: Callable[[list[Cell]], dict[str, Outcome]] | None = None,
) -> Plan:
    """Decide, from `machine`'s records (never another's) and the method registry, what becomes of each cell;
    reports each reused one. What the plan cannot read from records comes from the machine that runs the sweep:
    why a method cannot run there (`unavailable`, else this machine's registry), and, where the sweep counts its
    capped cells first (SweepRequest.precount), `past_cap`: the outcome of each of the given cells its count puts
    past its cap (suite.core.runner.counted_past_cap on the machine itself; the estimate's stored counts)."""
    p = Plan(new_sweep_id(), rounds=req.rounds, grouped=req.worker and req.measure == "time")
    for cell in cells:  # named as decided; numbered below among the cells that run
        p.tags[cell.key] = f"{req.experiment.name}/{cell.row.name} ({cell.run.method}, {req.profile})"
        p.decisions.append(_decide(req, cell, machine, p, progress, unavailable))
    _with_reference(req, cells, p, progress)
    if past_cap is not None and req.precount and req.measure == "time":
        # A stale cell ran under its cap at another code: it is measured again, never replaced by a count's verdict
        counted = past_cap([d.cell for d in p.of(RESUME, RUN)])
        for d in p.of(RESUME, RUN):
            if d.cell.key in counted:
                d.action, d.outcome, d.rounds = PAST_CAP, counted[d.cell.key], 0
    todo = p.todo
    for k, cell in enumerate(todo, 1):
        p.tags[cell.key] = f"[{k}/{len(todo)}] {p.tags[cell.key]}"
    return p


def _decide(
    req: SweepRequest,
    cell: Cell,
    machine: str,
    p: Plan,
    progress: Callable[[str], None],
    unavailable: Callable[[Cell], str | None] | None,
) -> Decision:
    """One cell's decision (a resumed or pending record also sets the sweep the rounds go on in)."""
    tag = p.tags[cell.key]
    cached = open_index(req.results_dir).cell(cell.key, machine, warn=progress)
    if cached is not None:
        p.own.add(cell.key)
    elif (version := open_index(req.results_dir).newer_schema(cell.key, machine)) is not None:
        why = f"its record here was written by a newer suite (schema {version}): left untouched, not measured"
        progress(f"{tag}: {why}")
        return Decision(cell, UNTOUCHED, why, failed(f"error: {why}"))
    kept = [] if req.force else resumable(cached, METHODOLOGY_VERSION, cell.code["code"])
    if kept:
        if aside := cached["metrics"].get("rounds_set_aside"):  # what earlier calls set aside stays in evidence
            p.aside[cell.key] = list(aside)
        p.sweep = cached.get("sweep") or p.sweep  # the rounds go on in the sweep they began in
    elif cached and status_of(cached).kind == "pending" and not req.force:
        p.sweep = cached.get("sweep") or p.sweep  # a sweep interrupted or cut before this cell ran: it goes on
    twin = same_as(req, cell, machine)  # forced too: the runner has had the twin's sweep run first (twins_due)
    if twin is not None:
        of = f"{twin['reused_from']['experiment']}/{twin['reused_from']['row']}"
        waits = status_of(twin).kind == "pending"
        said = "waits for " + of if waits else f"the same cell as {of} on {machine}, reused"
        progress(f"{tag}: {status_of(twin).kind} ({said})")
        return Decision(cell, TWIN, said, twin)
    planned, cannot = p.planned(cell), None
    if req.contended:  # only the rows timed on a busy machine, measured again (their reference beside them)
        busy = is_timed(cell.kind) and cached and status_of(cached).finished and contended(cached.get("metrics") or {})
        if busy and (cannot := not_run_reason(cell, req.measure, unavailable)) is None:
            progress(f"{tag}: contended ({cached['status']}, timed on a busy machine): measured again")
            return Decision(cell, STALE, f"{cached['status']} contended", rounds=planned)
        why = f"contended, kept: it cannot be measured again here ({cannot})" if busy else "not contended"
        return Decision(cell, LEFT, f"{why}: left as it stands (--contended)", cached)
    if cached and status_of(cached).finished and not req.force:
        why = stale_reason(cached, cell) if is_timed(cell.kind) else count_stale(cached) if cell.spec.on_host else None
        if why is not None and (cannot := not_run_reason(cell, req.measure, unavailable)) is not None:
            why += f"; kept, as it cannot be measured again here ({cannot})"  # never replaced by an error
        if why is None or req.stale == "keep" or cannot is not None:
            kept = f", stale: {why}" if why else ""
            if contended(cached.get("metrics") or {}):  # timed on a busy machine: its table shows no rate ratio
                kept += ", contended: no rate ratio shown (--contended measures it again)"
            progress(f"{tag}: {cached['status']} (cached on {machine}, {cell.key}{kept})")
            return Decision(cell, REUSED, f"{cached['status']} on {machine}{kept}", cached)
        progress(f"{tag}: stale ({cached['status']} {why}): measured again (--keep-stale keeps it)")
        return Decision(cell, STALE, f"{cached['status']} {why}", rounds=planned)
    if req.stale == "only":
        why = "not stale: left as it stands (--only-stale)"
        return Decision(cell, LEFT, why, cached)
    if (
        cached is None
        and not req.force
        and cell.spec.on_host
        and (same := counted_alike(req, cell, machine)) is not None
    ):
        why = f"counted on {machine_of(same)} by this code under the same torch and transformers"
        progress(f"{tag}: {same['status']} ({why}: reused, not counted again)")
        return Decision(cell, REUSED, why, same)
    if (why := not_run_reason(cell, req.measure, unavailable)) is not None:
        return Decision(cell, NOT_RUN, why)
    if len(kept) >= planned:
        return Decision(cell, COMPLETE, resumed=kept)
    return Decision(cell, RESUME if kept else RUN, resumed=kept, rounds=planned - len(kept))


def counted_alike(req: SweepRequest, cell: Cell, machine: str) -> Record | None:
    """Another machine's finished count of `cell` made by the cell's code now (provenance.code, suite.core.cell_code)
    under this torch and transformers: a count runs on fake tensors, so what decides it is the code, the cell's config
    (its shapes and counting device, in its key) and those versions, never the CPU; a new machine reuses it. None
    where none is."""
    mine = {"code": cell.code["code"], **dict(zip(("torch", "transformers"), versions()))}
    for rec in open_index(req.results_dir).others(cell.key, machine):
        prov = rec.get("provenance") or {}
        if status_of(rec).finished and all(prov.get(k) == v for k, v in mine.items()):
            return rec
    return None


def _with_reference(req: SweepRequest, cells: list[Cell], p: Plan, progress: Callable[[str], None]) -> None:
    """Rows measured in this sweep take their ratios to the experiment's reference row only within one sweep: a
    reference finished in another sweep is measured again beside them, first in each round, so that they carry
    ratios (a subset re-run with --only, a cell re-measured after a corrupt record). The rows reused from that
    other sweep then show none, and the table says so."""
    exp = req.experiment
    if not p.todo or not any(m.ratio for m in exp.metrics):
        return
    ref = next((d for d in p.decisions if d.cell.row.name == exp.baseline), None)
    if ref is None or ref.action not in (REUSED, LEFT) or (ref.outcome or {}).get("sweep") == p.sweep:
        return  # (a reference left by --only-stale or --contended is measured beside their rows all the same)
    p.decisions.remove(ref)
    p.decisions.insert(
        0, Decision(ref.cell, RUN, "the reference row, beside rows that take ratios to it", rounds=p.planned(ref.cell))
    )
    progress(f"{p.tags[ref.cell.key]}: measured again, beside the rows of sweep {p.sweep} that take their ratios to it")
