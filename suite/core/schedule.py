"""Where and in what order a sweep's cells run: which may share the worker, and each round's order."""

from __future__ import annotations

from suite.core.experiment import Cell
from suite.harness.model import shape_key


def pooled(cell: Cell) -> bool:
    """Whether a cell may run in a worker: a single-rank timed cell of one of our methods or of a peer whose
    library keeps no process-wide state but its process group (Method.shares_worker; several ranks need their own
    processes; the benchmarks and counts keep theirs)."""
    if not cell.spec.timed or (method := cell.method_class) is None or cell.world != 1:
        return False
    return method.peer is None if method.shares_worker is None else method.shares_worker


def shape_of(cell: Cell) -> str:
    """What the worker's pool keeps one of at a time: the model's shape (suite.harness.model.ModelPool)."""
    return shape_key(cell.run.model)


def by_shape(cells: list[Cell], r: int = 1) -> list[Cell]:
    """Round `r`'s cells grouped by model shape, in the plan's order within each group and the groups in the order
    of their first cells, reversed in even rounds, so that the worker's pool builds each shape once a round at most
    and a round begins with the shape the last one ended with."""
    first: dict[str, int] = {}
    order = sorted(cells, key=lambda c: first.setdefault(shape_of(c), len(first)))
    if r % 2:
        return order
    return sorted(order, key=lambda c: -first[shape_of(c)])
