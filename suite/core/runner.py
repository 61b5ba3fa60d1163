"""Runs a sweep: plan its cells, run the rest through the sweep's launcher in interleaved rounds, record each here."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from suite.config import host, paths
from suite.core import launcher, precount, process
from suite.core.experiment import Cell
from suite.core.launcher import Fresh, choose
from suite.core.nodes import follow
from suite.core.plan import (
    COMPLETE,
    LEFT,
    NOT_RUN,
    PAST_CAP,
    REUSED,
    RUNS,
    TWIN,
    UNTOUCHED,
    Decision,
    Plan,
    expand,
    plan,
)
from suite.core.recorder import CellRounds, Recorder
from suite.core.request import SweepRequest
from suite.core.rounds import merge
from suite.harness.device import device_type
from suite.measure.machine import fingerprint
from suite.records import store
from suite.records.index import open_index
from suite.records.schema import Outcome, Record, failed


def run_cells(
    req: SweepRequest,
    progress: Callable[[str], None] = print,
    twins: Callable[[dict[str, list[str]]], None] | None = None,
) -> list[tuple[Cell, Record]]:
    """Run (or reuse) every cell `req` asks for on this machine, one record and one W&B run per cell; returns each
    cell with its record (labelled: its row and key, a cell left at a deadline `pending`). Throughput cells run
    `req.rounds` times, the cells of one round after another (ABC ABC ABC) so that drift hits all alike. A record
    is reused only on the machine that made it.

    A partial record (rounds left when a call ended) resumes: its measured rounds are kept and only the missing
    ones run, in its own sweep. With a deadline no cell-round starts that the longest one seen so far would carry
    past it; the cells left are reported and a later call resumes them.

    A row that is another table's cell (Row.same_as) takes that cell's record here, with its sweep: where the plan
    finds such twins to measure first (Plan.twins_due), `twins` runs them, in their own table's sweep, before the
    plan that runs this one (pending where the twin still has none finished). With
    `req.precount` a capped cell of our methods is counted first and, past its cap, recorded `oom` without running.
    With `req.worker` single-rank timed cells of our methods run in one long-lived process (suite.core.worker).

    Across nodes (suite.core.nodes): node 0 does all of this, its multi-rank cells spanning every node; another
    node follows node 0's launches and returns [], having written nothing.

    The tables are the face's to render (suite.commands.sweep): the engine stands below the reports."""
    cells = expand(req)
    process.remove_orphaned_scratch()  # what runners killed with SIGKILL left behind
    if req.follower:
        follow(req.nodes, progress)
        return []
    fp = fingerprint()
    store.writable(req.results_dir, fp["slug"])  # before anything runs

    def counts(todo: list[Cell]) -> dict[str, Outcome]:
        return counted_past_cap(todo, req.timeout, progress, req.results_dir)

    has_twins = twins is not None and any(c.row.same_as is not None for c in cells)
    if has_twins and (due := plan(req, cells, fp["slug"], lambda _: None).twins_due(req.force)):
        twins(due)  # the rows that are another table's cells, measured first in that table's sweep (the face's)
    p = plan(req, cells, fp["slug"], progress, past_cap=counts)
    recorder = Recorder(req, fp, p.sweep, progress)
    records = {d.cell.key: settle(d, recorder) for d in p.decisions if d.action not in RUNS}
    if p.todo:
        if req.measure == "count":
            verb, how = "counting", "memory counted on fake tensors, once per cell"
        else:
            timed = sum(p.planned(c) > 1 for c in p.todo)
            verb, how = "measuring", "each cell once"
            if timed:
                how = f"throughput cells in {req.rounds} interleaved round(s)"
                how += ", the others once" if timed < len(p.todo) else ""
        progress(f"{verb} {len(p.todo)} cell(s) on {fp['slug']}, sweep {p.sweep}: {how}")
    records.update(Rounds(req, p, recorder, progress).run())
    pending = failed("pending: left at the deadline")
    found = (records.get(c.key) or open_index(req.results_dir).cell(c.key, fp["slug"]) for c in cells)
    return [(c, r or recorder.label(c, pending)) for c, r in zip(cells, found)]


def settle(d: Decision, recorder: Recorder) -> Record:
    """The record of a cell the plan settles without running it: reused as it is, a twin's (final once the twin
    finished), a newer suite's (said, not saved), not run and why, counted past its cap, or resumed complete."""
    cell, outcome = d.cell, d.outcome
    if d.action == REUSED:
        return outcome
    if d.action == UNTOUCHED:
        return recorder.label(cell, outcome)
    if d.action == LEFT:  # its record as it stands, or (none) a line for the table, not saved
        return outcome if outcome is not None else recorder.label(cell, failed(f"pending: {d.why}"))
    if d.action == TWIN:
        return recorder.save(cell, outcome)
    if d.action == NOT_RUN:
        return recorder.save(cell, failed("not_implemented", d.why))
    if d.action == PAST_CAP:
        return recorder.save(cell, outcome)
    assert d.action == COMPLETE, d.action
    return recorder.save(cell, merge(d.resumed, len(d.resumed)))


def counted_past_cap(
    cells: list[Cell], timeout: float | None, progress: Callable[[str], None], results_dir: Path | None = None
) -> dict[str, Outcome]:
    """Count each capped timed cell of one of our methods on fake tensors (CPU seconds, no device), in parallel;
    return an `oom` outcome (counted) for each past its cap, or whose host need (host_need: a count's host peak, a
    peer's offload) passes what this host offers a cell (host_room), which is then recorded without running. A
    peer's count on a CPU takes the host's allocations for the device's (docs/counting.md): one whose offload it can
    bound (Method.count_allowance) is counted against its cap plus that bound, any other always runs. A count stored
    before (suite.core.precount) by the same code under the same versions is taken instead of counting again."""
    from suite.measure.provenance import versions

    eligible = precount.capped(cells)
    if not eligible:
        return {}
    mine = versions()
    stored = {c.key: precount.load(results_dir, c, *mine) for c in eligible} if results_dir else {}
    fresh = [c for c in eligible if stored.get(c.key) is None]
    if len(fresh) < len(eligible):
        progress(
            f"{len(eligible) - len(fresh)} of {len(eligible)} capped cell(s) counted before (results/campaign/precount)"
        )
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        counts = {c.key: pool.submit(launcher.run_cell, precount.count_of(c), timeout) for c in fresh}
    out: dict[str, Outcome] = {}
    room = host_room()
    for c in eligible:
        got = stored.get(c.key) or counts[c.key].result()
        where = " before, in results/campaign/precount" if stored.get(c.key) else ""
        need = host_need(c, got)
        if got["status"] == "ok" and need and room is not None and need > room:
            why = (
                f"not run: its count needs {need / 2**30:.1f} GiB of host memory, past the "
                f"{room / 2**30:.1f} GiB this host offers a cell (its RAM less {HOST_RESERVE / 2**30:.0f} GiB)"
            )
            metrics = {**got["metrics"], "memory_kind": f"counted (fake tensors){where}: past the host, not run"}
            out[c.key] = {**failed("oom", why, metrics), "provenance": got["provenance"]}
            progress(f"{c.experiment}/{c.row.name}: oom (counted{where}: {why[9:]})")
            continue
        if got["status"] != "oom":
            continue
        metrics = {**got["metrics"], "memory_kind": f"counted (fake tensors){where}: past the cap, not run"}
        why = f"not run: its count passed the {c.run.device_memory} device cap ({got['metrics']})"
        out[c.key] = {**failed("oom", why, metrics), "provenance": got["provenance"]}
        progress(f"{c.experiment}/{c.row.name}: oom (counted{where} past its {c.run.device_memory} cap; not run)")
    return out


# Host memory a cell process holds that a count does not: Python, torch and the CUDA libraries' own pages, CUDA's
# staging, the sweep's parent process and the system beside it. Assumed (not yet measured on a lent GPU: the counted
# host peak against the RSS of an 8B row will say).
HOST_RESERVE = 8 * 2**30


def host_room() -> int | None:
    """The host bytes a cell may count on: this host's usable RAM (suite.config.host) less HOST_RESERVE."""
    ram = host.ram_bytes()
    return None if ram is None else ram - HOST_RESERVE


def host_need(cell: Cell, count: Outcome) -> int | None:
    """The host bytes `count` (a cell's count) says the cell needs on an accelerator: our method's counted host peak
    where it keeps one apart from the device (L2L's param server), or what a peer's offload keeps on the host
    (Method.count_allowance); None where the cell runs on the host itself or nothing says."""
    if device_type(cell.run.device) == "cpu":
        return None
    counted = (count.get("metrics") or {}).get("host_peak_bytes")
    if isinstance(counted, (int, float)):
        return int(counted)
    allowance = cell.method_class.count_allowance(cell.run) if cell.method_class is not None else None
    return allowance or None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a sweep measured: what it kept, what it discarded, and how to go on, in one line."""


class Rounds:
    """The cells a plan leaves to measure, pass by pass: each due cell-round run through the sweep's launcher and
    handed to its cell's CellRounds, which the recorder saves (suite.core.recorder); a deadline leaves the rest."""

    def __init__(self, req: SweepRequest, p: Plan, recorder: Recorder, progress: Callable[[str], None]):
        self.req, self.recorder, self.progress, self.plan = req, recorder, progress, p
        self.todo, self.tags, self.sweep = p.todo, p.tags, p.sweep
        self.cells = {
            d.cell.key: CellRounds(
                d.cell, p.planned(d.cell), d.resumed, p.aside.get(d.cell.key, []), d.cell.key in p.own, req.force
            )
            for d in p.of(*RUNS)
        }
        self.longest, self.left = 0.0, []  # the longest cell-round so far; the cell-rounds left at the deadline
        self.launcher: Fresh | None = None  # chosen when the rounds start (launcher.choose)
        # For the time left: the cell-rounds this call has to run, and the seconds those run so far took.
        self.total = sum(max(c.planned - len(c.done), 0) for c in self.cells.values())
        self.ran, self.spent = 0, 0.0

    def run(self) -> dict[str, Record]:
        """Every due cell-round, pass by pass (the passes past `rounds` make up rounds set aside: CellRounds.take);
        returns the records made."""
        records: dict[str, Record] = {}
        fresh = [c for c in self.todo if not self.cells[c.key].done]
        self.launcher = choose(self.req, self.sweep, fresh, self.progress)
        completed = False
        try:
            for r in range(1, 2 * self.req.rounds + 1):
                for cell in self.plan.order([c for c in self.todo if self.cells[c.key].due(r)], r):
                    cr = self.cells[cell.key]
                    tag = self.tags[cell.key] + (f" round {len(cr.done) + 1}/{cr.planned}" if cr.planned > 1 else "")
                    if self.req.deadline is not None and (self.left or time.time() + self.longest > self.req.deadline):
                        self.left.append(tag)
                        continue
                    try:
                        records[cell.key] = self.one(cr, tag)
                    except Interrupted:
                        raise
                    except KeyboardInterrupt:  # between a launch's steps: the round is discarded all the same
                        raise self.interrupted(cr, tag) from None
            completed = True
        finally:
            self.launcher.close(completed)  # where it did not complete: every cell process at once
        if self.left:
            n = len(self.left)
            self.recorder.hold(self.cells.values(), "left at the deadline; the same command runs it in this sweep")
            if self.req.force and (rest := self.not_in_full()):
                self.progress(f"deadline reached: {n} cell-round(s) left; {self.forced_rest(rest)}")
            else:
                self.progress(
                    f"deadline reached: {n} cell-round(s) left for the next call (the same command resumes them)"
                )
        return records

    def one(self, cr: CellRounds, tag: str) -> Record:
        """One round of `cr`'s cell: run it, hand it to the cell's rounds, save the record, report it."""
        self.progress(f"{tag}: running ...")
        started = time.time()
        outcome = self.launcher.run(cr.cell, self.req.timeout)
        took = time.time() - started
        if outcome["status"] == "error: interrupted":
            raise KeyboardInterrupt
        self.longest = max(self.longest, took)  # the deadline's yardstick
        if said := cr.take(outcome):
            self.progress(f"{tag}: {said}")
        record = self.recorder.record(cr, tag)  # saved before it is reported
        self.ran, self.spent = self.ran + 1, self.spent + took
        own = outcome.get("duration_s")  # the cell's own time (a count that ran ahead was waited on for none)
        own = own if isinstance(own, (int, float)) else took
        self.progress(f"{tag}: {record['status']} in {own:.1f}s{self._figures(outcome, record)}{self._left()}")
        return record

    def not_in_full(self) -> list[Cell]:
        """Under --force, the cells this call did not measure again in full (an earlier record kept, or none made)."""
        return [c for c in self.todo if not self.cells[c.key].in_full]

    def interrupted(self, cr: CellRounds, tag: str) -> Interrupted:
        """The running round is discarded; the cell's finished rounds are kept (Recorder.interrupted), the cells not
        begun held in this sweep, which the same command resumes; says so in one line."""
        self.recorder.interrupted(cr, tag)
        self.recorder.hold(self.cells.values(), "interrupted before it ran; the same command runs it in this sweep")
        what = f"interrupted: {tag.split('] ', 1)[-1]} discarded its running round"
        if not self.req.force:
            rounds = sum(len(c.done) for c in self.cells.values())
            return Interrupted(
                f"{what}; {rounds} finished cell-round(s) of sweep {self.sweep} are kept, and the same command "
                "resumes it"
            )
        left = self.not_in_full()
        if not left:
            return Interrupted(f"{what}; every cell of sweep {self.sweep} was measured again in full")
        return Interrupted(
            f"{what}; {len(self.todo) - len(left)} cell(s) measured again in full, {self.forced_rest(left)}"
        )

    def forced_rest(self, rest: list[Cell]) -> str:
        """What a --force sweep cut short says of the cells it did not measure again in full, and how to."""
        return (
            f"{len(rest)} not (those with a record keep it: --force replaces a record only with a complete one); to "
            f"measure them again: {self.command(rest)}"
        )

    def command(self, cells: list[Cell]) -> str:
        """The command that measures `cells` again as this sweep asked (--force, its profile, settings, rounds)."""
        req = self.req
        parts = [*paths.suite_command(), "run", req.experiment.name, "--profile", req.profile, "--force"]
        parts += ["--rounds", str(req.rounds)] if req.rounds != req.experiment.rounds else []
        parts += ["--timeout", f"{req.timeout:g}"] if req.timeout is not None else []
        parts += [*req.settings, *(["--worker"] if req.worker else [])]
        for c in cells:
            parts += ["--only", c.row.name]
        return shlex.join(parts)  # (a sweep across nodes: each node runs it with its --nnodes and --node-rank)

    @staticmethod
    def _figures(outcome: Outcome, record: Record) -> str:
        """This round's figures with their units, and the median of the rounds so far where there are several."""
        now, merged = outcome.get("metrics") or {}, record["metrics"]
        parts = []
        if isinstance(now.get("throughput"), (int, float)):
            rounds = merged.get("throughput_rounds") or []
            median = f" (median of {len(rounds)}: {merged['throughput']:.4g})" if len(rounds) > 1 else ""
            parts.append(f"this round {now['throughput']:.4g} samples/s{median}")
        if isinstance(now.get("memory_gb"), (int, float)):
            parts.append(f"memory {now['memory_gb']:.4g} GB")
        if (now.get("contention") or {}).get("contended"):
            parts.append("contended: " + "; ".join(now["contention"]["reasons"]))
        return "; " + ", ".join(parts) if parts else ""

    def _left(self) -> str:
        """What is left; for timings, about how long at the mean so far (counts vary too widely between cells, and
        run ahead, to say)."""
        left = self.total - self.ran
        if left <= 0:
            return ""
        if self.req.measure == "count":
            return f"; {left} cell(s) left"
        return f"; {left} cell-round(s) left, about {left * self.spent / self.ran:.0f}s at the mean so far"
