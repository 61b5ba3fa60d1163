"""Runs a sweep: plan its cells, run the rest through the sweep's launcher in interleaved rounds, record each here."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from suite.config import paths
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
    due,
    expand,
    plan,
)
from suite.core.recorder import Recorder
from suite.core.request import SweepRequest
from suite.core.rounds import comparable, merge
from suite.measure.machine import fingerprint
from suite.records import store
from suite.records.schema import Outcome, Record, failed, status_of


def run_cells(req: SweepRequest, progress: Callable[[str], None] = print) -> list[tuple[Cell, Record]]:
    """Run (or reuse) every cell `req` asks for on this machine, one record and one W&B run per cell; returns each
    cell with its record (labelled: its row and key, a cell left at a deadline `pending`). Throughput cells run
    `req.rounds` times, the cells of one round after another (ABC ABC ABC) so that drift hits all alike. A record
    is reused only on the machine that made it.

    A partial record (rounds left when a call ended) resumes: its measured rounds are kept and only the missing
    ones run, in its own sweep. With a deadline no cell-round starts that the longest one seen so far would carry
    past it; the cells left are reported and a later call resumes them.

    A row that is another table's cell (Row.same_as) takes that cell's record here, with its sweep (pending where the
    twin has none finished: suite.commands.sweep.twins_first measures it first). With
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

    p = plan(req, cells, fp["slug"], progress, past_cap=counts)
    recorder = Recorder(req, fp, p.sweep, progress)
    records = {d.cell.key: settle(d, recorder) for d in p.decisions if d.action not in RUNS}
    if p.todo:
        if req.measure == "count":
            verb, how = "counting", "memory counted on fake tensors, once per cell"
        else:
            verb, how = "measuring", f"throughput cells in {req.rounds} interleaved round(s)"
        progress(f"{verb} {len(p.todo)} cell(s) on {fp['slug']}, sweep {p.sweep}: {how}")
    records.update(Rounds(req, p, recorder, progress).run())
    pending = failed("pending: left at the deadline")
    found = (records.get(c.key) or store.load(req.results_dir, c.key, fp["slug"]) for c in cells)
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
        return recorder.save(cell, outcome, final=status_of(outcome).kind != "pending")
    if d.action == NOT_RUN:
        return recorder.save(cell, failed("not_implemented", d.why))
    if d.action == PAST_CAP:
        return recorder.save(cell, outcome, final=True)
    assert d.action == COMPLETE, d.action
    return recorder.save(cell, merge(d.resumed, len(d.resumed)))


def counted_past_cap(
    cells: list[Cell], timeout: float | None, progress: Callable[[str], None], results_dir: Path | None = None
) -> dict[str, Outcome]:
    """Count each capped timed cell of one of our methods on fake tensors (CPU seconds, no device), in parallel;
    return an `oom` outcome (counted) for each past its cap, which is then recorded without running. A peer's count
    on a CPU takes the host's allocations for the device's (docs/counting.md): one whose offload it can bound
    (Method.count_allowance) is counted against its cap plus that bound, any other always runs. A count stored
    before (suite.core.precount) by the same code under the same versions is taken instead of counting again."""
    from suite.measure.provenance import code_digest, versions

    eligible = precount.capped(cells)
    if not eligible:
        return {}
    mine = (code_digest(), *versions())
    stored = {c.key: precount.load(results_dir, c, *mine) for c in eligible} if results_dir else {}
    fresh = [c for c in eligible if stored.get(c.key) is None]
    if len(fresh) < len(eligible):
        progress(
            f"{len(eligible) - len(fresh)} of {len(eligible)} capped cell(s) counted before (results/campaign/precount)"
        )
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        counts = {c.key: pool.submit(launcher.run_cell, precount.count_of(c), timeout) for c in fresh}
    out: dict[str, Outcome] = {}
    for c in eligible:
        got = stored.get(c.key) or counts[c.key].result()
        if got["status"] != "oom":
            continue
        where = " before, in results/campaign/precount" if stored.get(c.key) else ""
        metrics = {**got["metrics"], "memory_kind": f"counted (fake tensors){where}: past the cap, not run"}
        why = f"not run: its count passed the {c.run.device_memory} device cap ({got['metrics']})"
        out[c.key] = {**failed("oom", why, metrics), "provenance": got["provenance"]}
        progress(f"{c.experiment}/{c.row.name}: oom (counted{where} past its {c.run.device_memory} cap; not run)")
    return out


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a sweep measured: what it kept, what it discarded, and how to go on, in one line."""


class Rounds:
    """The cells a plan leaves to measure, round by round, each round's outcome merged into the cell's record."""

    def __init__(self, req: SweepRequest, p: Plan, recorder: Recorder, progress: Callable[[str], None]):
        self.req, self.recorder, self.progress, self.plan = req, recorder, progress, p
        self.todo, self.tags, self.sweep = p.todo, p.tags, p.sweep
        self.done = {d.cell.key: list(d.resumed) for d in p.of(*RUNS)}  # each cell's rounds: resumed, then new
        self.longest, self.left = 0.0, []  # the longest cell-round so far; the cell-rounds left at the deadline
        self.launcher: Fresh | None = None  # chosen when the rounds start (launcher.choose)
        # Each cell's rounds of another path, set aside (one_path), those of the calls it resumes from included.
        self.aside: dict[str, list[dict]] = {k: list(v) for k, v in p.aside.items()}
        # For the time left: the cell-rounds this call has to run, and the seconds those run so far took.
        self.total = sum(max(self.planned(c) - len(self.done[c.key]), 0) for c in p.todo)
        self.ran, self.spent = 0, 0.0
        self.own = p.own  # cells with a record here before this call: never written over by a hold
        self.replaced: set[str] = set()  # under --force, the cells whose complete new record has replaced the old

    def keeps_earlier(self, cell: Cell) -> bool:
        """Whether `cell`'s earlier record stands until its new one is complete: under --force, where it has one (a
        forced sweep cut short must not leave a partial record, or none, where a finished one was)."""
        return self.req.force and cell.key in self.own and cell.key not in self.replaced

    def planned(self, cell: Cell) -> int:
        return self.plan.planned(cell)

    def due(self, cell: Cell, r: int) -> bool:
        """Whether `cell` runs a round in pass `r` (plan.due: one whose rounds of another path were set aside makes
        them up in the passes after the last), and none failed."""
        done = self.done[cell.key]
        making_up = cell.key in self.aside  # only rounds set aside are made up past the last pass
        return due(len(done), self.planned(cell), r, making_up) and not (done and done[-1]["status"] != "ok")

    def run(self) -> dict[str, Record]:
        """Every due cell-round, round by round; returns the records made."""
        records: dict[str, Record] = {}
        req = self.req
        fresh = [c for c in self.todo if not self.done[c.key]]
        self.launcher = choose(req, self.sweep, fresh, self.progress)
        completed = False
        try:
            for r in range(1, 2 * req.rounds + 1):  # the passes past `rounds` make up rounds set aside (one_path)
                for cell in self.plan.order([c for c in self.todo if self.due(c, r)], r):
                    planned = self.planned(cell)
                    tag = self.tags[cell.key] + (
                        f" round {len(self.done[cell.key]) + 1}/{planned}" if planned > 1 else ""
                    )
                    if req.deadline is not None and (self.left or time.time() + self.longest > req.deadline):
                        self.left.append(tag)
                        continue
                    try:
                        records[cell.key] = self.one(cell, tag)
                    except Interrupted:
                        raise
                    except KeyboardInterrupt:  # between a launch's steps: the round is discarded all the same
                        raise self.interrupted(cell, tag) from None
            completed = True
        finally:
            self.launcher.close(completed)  # where it did not complete: every cell process at once
        if self.left:
            n = len(self.left)
            self.hold("left at the deadline; the same command runs it in this sweep")
            if req.force and (rest := self.not_in_full()):
                self.progress(f"deadline reached: {n} cell-round(s) left; {self.forced_rest(rest)}")
            else:
                self.progress(
                    f"deadline reached: {n} cell-round(s) left for the next call (the same command resumes them)"
                )
        return records

    def not_in_full(self) -> list[Cell]:
        """Under --force, the cells this call did not measure again in full (an earlier record kept, or none made)."""
        return [c for c in self.todo if self.keeps_earlier(c) or (c.key not in self.own and not self.final(c))]

    def hold(self, why: str) -> None:
        """Save each cell that has not measured a round yet and has no record of its own as `pending: <why>` in this
        sweep, so that the call which runs it joins the sweep (suite.core.plan) and its ratios hold. A record there
        before (finished, partial, an error) is never written over: such a cell joins the sweep through the cells
        this call did record (their partial records), or, where there are none, is measured in a new sweep."""
        for cell in self.todo:
            if not self.done[cell.key] and cell.key not in self.own:
                self.recorder.save(cell, failed(f"pending: {why}"))

    def interrupted(self, cell: Cell, tag: str) -> Interrupted:
        """The running round is discarded; the cell's finished rounds are saved as a partial record (in this sweep,
        which the same command resumes), but under --force over no earlier record of its own (that stands until
        its replacement is complete); a cell with none keeps whatever record it had."""
        kept = [r for r in self.done[cell.key] if r["status"] == "ok"]
        if kept and len(kept) < self.planned(cell) and not self.keeps_earlier(cell):  # (all done: saved final)
            self.recorder.save(cell, self.with_aside(cell, merge(kept, self.planned(cell))), final=False, tag=tag)
        self.hold("interrupted before it ran; the same command runs it in this sweep")
        what = f"interrupted: {tag.split('] ', 1)[-1]} discarded its running round"
        if not self.req.force:
            rounds = sum(len(v) for v in self.done.values())
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

    def final(self, cell: Cell) -> bool:
        done = self.done[cell.key]
        return bool(done) and (len(done) >= self.planned(cell) or done[-1]["status"] != "ok")

    def command(self, cells: list[Cell]) -> str:
        """The command that measures `cells` again as this sweep asked (--force, its profile, settings, rounds)."""
        req = self.req
        parts = [*paths.suite_command(), "run", req.experiment.name, "--profile", req.profile, "--force"]
        parts += ["--rounds", str(req.rounds)] if req.rounds != req.experiment.rounds else []
        parts += ["--timeout", f"{req.timeout:g}"] if req.timeout is not None else []
        parts += ["--device-memory", req.device_memory] if req.device_memory else []
        for o in req.overrides or ():
            parts += ["--set", o]
        parts += ["--worker"] if req.worker else []
        parts += ["--measure", "count"] if req.measure == "count" else []
        for c in cells:
            parts += ["--only", c.row.name]
        return shlex.join(parts)  # (a sweep across nodes: each node runs it with its --nnodes and --node-rank)

    def one(self, cell: Cell, tag: str) -> Record:
        """One round of `cell`: run it, merge it with the rounds before, save the record, report it."""
        self.progress(f"{tag}: running ...")
        started = time.time()
        outcome = self.launcher.run(cell, self.req.timeout)
        took = time.time() - started
        if outcome["status"] == "error: interrupted":
            raise KeyboardInterrupt
        self.longest = max(self.longest, took)  # the deadline's yardstick
        outcome = self.one_path(cell, outcome, tag)
        self.done[cell.key].append(outcome)
        merged = self.with_aside(cell, merge(self.done[cell.key], self.planned(cell)))
        final = status_of(merged).kind != "partial"
        if final or not self.keeps_earlier(cell):
            record = self.recorder.save(cell, merged, final, tag)  # saved before it is reported
            if final:
                self.replaced.add(cell.key)
        else:  # under --force the earlier record stands until this one is complete
            record = self.recorder.label(cell, merged)
        self.ran, self.spent = self.ran + 1, self.spent + took
        own = outcome.get("duration_s")  # the cell's own time (a count that ran ahead was waited on for none)
        own = own if isinstance(own, (int, float)) else took
        self.progress(f"{tag}: {record['status']} in {own:.1f}s{self._figures(outcome, record)}{self._left()}")
        return record

    def with_aside(self, cell: Cell, merged: Outcome) -> Outcome:
        """`merged` with the cell's rounds set aside in its metrics (a partial record resumed later keeps them)."""
        if not self.aside.get(cell.key):
            return merged
        return {**merged, "metrics": {**merged["metrics"], "rounds_set_aside": self.aside[cell.key]}}

    def one_path(self, cell: Cell, outcome: Outcome, tag: str) -> Outcome:
        """No silent choice between rounds of different paths (the code, or the harness: dropout path, attention
        kernel, LAMB kernel). A round whose path differs from the cell's rounds before it sets those aside (their
        figures kept in the record's `rounds_set_aside`, out of its median) and the cell is measured again under
        this round's path in the passes that follow; a cell whose path changes a second time is an error naming
        both paths (its figures those of the second path's rounds)."""
        before = [r for r in self.done[cell.key] if r["status"] == "ok"]
        if outcome["status"] != "ok" or not before or comparable(before[-1]) == comparable(outcome):
            return outcome
        paths = f"{_path_of(before[-1])}, then {_path_of(outcome)}"
        kept = ("throughput", "memory_gb")
        self.aside.setdefault(cell.key, []).extend(
            {"path": _path_of(r), **{k: r["metrics"].get(k) for k in kept}} for r in before
        )
        if len(self.aside[cell.key]) > len(before):  # set aside before: the path changed twice
            return failed(f"error: its rounds took different paths twice ({paths})", outcome.get("error"))
        self.done[cell.key] = []
        self.progress(f"{tag}: {len(before)} earlier round(s) ran another path ({paths}): set aside, measured again")
        return outcome

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


def _path_of(outcome: Outcome) -> str:
    """A round's path as its record states it: the code's digest and the harness's paths, e.g. `code 1a2b3c4d;
    dropout hash_triton, attention_triton (tuned); host_lamb fused`."""
    prov = outcome.get("provenance") or {}
    parts = [f"code {str(prov['code'])[:8]}"] if prov.get("code") else []
    for name, taken in sorted((prov.get("harness") or {}).items()):
        if isinstance(taken, dict):
            taken = ", ".join(f"{k} ({v})" if v else str(k) for k, v in sorted(taken.items()))
        parts.append(f"{name} {taken}")
    return "; ".join(parts) or "no path recorded"
