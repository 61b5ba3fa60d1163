"""How a sweep's cells are launched, chosen once per sweep (`choose`): in a fresh process each, in the worker, across
nodes, or as counts running ahead. Each launcher has one `run(cell, timeout) -> Outcome` (exactly one status) and
`close`; the order a round's cells run in is the plan's (suite.core.plan.Plan.order)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from suite.core.experiment import Cell
from suite.core.nodes import Coordinator, lead
from suite.core.process import kill_running, launch
from suite.core.request import SweepRequest
from suite.core.schedule import pooled
from suite.core.worker_client import Worker, shared_worker
from suite.records.schema import Outcome


def run_cell(cell: Cell, timeout: float | None = None) -> Outcome:
    """Run one cell in a fresh process (torchrun's ranks where it has several) on this machine; returns its record
    with exactly one status."""
    record, failure = launch(cell.resolved(), cell.world, cell.timeout if timeout is None else timeout)
    return record or failure


class Fresh:
    """Each cell-round in a process of its own (torchrun's ranks where it has several): nothing carries over."""

    def run(self, cell: Cell, timeout: float | None = None) -> Outcome:
        return run_cell(cell, timeout)

    def close(self, completed: bool) -> None:
        """End what this launcher started; where the sweep did not complete, every cell process at once."""
        if not completed:
            kill_running()


class InWorker(Fresh):
    """The single-rank timed cells that may share a process (schedule.pooled) in the long-lived worker (the plan
    groups each round's cells by model shape for it); the others in fresh processes."""

    def __init__(self, worker: Worker):
        self.worker = worker

    def run(self, cell: Cell, timeout: float | None = None) -> Outcome:
        if not pooled(cell):
            return run_cell(cell, timeout)
        return self.worker.run(cell.resolved(), cell.timeout if timeout is None else timeout)


class CountsAhead(Fresh):
    """Counts (not timings): all started at once, one process per core, each taken when its turn comes."""

    def __init__(self, cells: list[Cell], timeout: float | None):
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1)
        self.ahead = {c.key: self.pool.submit(run_cell, c, timeout) for c in cells}

    def run(self, cell: Cell, timeout: float | None = None) -> Outcome:
        future = self.ahead.pop(cell.key, None)
        return future.result() if future is not None else run_cell(cell, timeout)

    def close(self, completed: bool) -> None:
        super().close(completed)  # counts still running in their threads, each its own process
        self.pool.shutdown(wait=completed, cancel_futures=True)


class AcrossNodes(Fresh):
    """Node 0 of a sweep across nodes: a multi-rank cell spans every node (suite.core.nodes.lead); a single-rank
    one runs here through `local`. Holds the rendezvous for the sweep; `close` ends the other nodes' following."""

    def __init__(self, req: SweepRequest, sweep: str, local: Fresh, progress: Callable[[str], None]):
        self.coord = Coordinator.host(req.nodes, progress)
        self.sweep, self.local = sweep, local

    def run(self, cell: Cell, timeout: float | None = None) -> Outcome:
        if cell.world == 1:
            return self.local.run(cell, timeout)
        return lead(cell, cell.timeout if timeout is None else timeout, self.coord, self.sweep)

    def close(self, completed: bool) -> None:
        self.local.close(completed)
        self.coord.finish(wait=completed)


def choose(req: SweepRequest, sweep: str, fresh: list[Cell], progress: Callable[[str], None]) -> Fresh:
    """The sweep's launcher: across nodes when it spans several; counts side by side when it counts with no
    deadline (`fresh`: the cells no earlier call counted); the worker when asked for and timing; else a fresh
    process per cell-round."""
    if req.measure == "count" and not req.nodes.multi and req.deadline is None:
        return CountsAhead(fresh, req.timeout)
    local = InWorker(shared_worker()) if req.worker and req.measure == "time" else Fresh()
    return AcrossNodes(req, sweep, local, progress) if req.nodes.multi else local
