"""The code a cell runs: the files its engine, its kind's function and its method load, and their digest.

A record states its cell's code (`provenance.code`, with `provenance.code_files`: each file and its content's digest),
so adding a method changes no other cell's code, editing a method changes its own cells', and editing the harness
changes every cell's. A sweep measures again a timed record whose code is not its cell's code now (suite.core.plan);
a stored count is taken for a cell of the same code (suite.core.precount). docs/measuring.md states the rule.
"""

from __future__ import annotations

from suite.core import registry
from suite.core.kinds import KINDS
from suite.measure import sources

# The engine every cell runs through: the cell process, the long-lived worker that may run it instead (the same code
# whichever ran it, so rounds of both merge) and what each imports, the measurement included.
ENGINE = ("suite.core.cell", "suite.core.worker")
# Modules that are lists of names, not code a cell runs: the method catalogue (what a line decides, the module of a
# cell's method, is among its roots already), so a catalogue line for a new method stales no other method's records.
NOT_CODE = ("suite.core.method_catalogue",)


def roots(kind: str, method: str | None, options: dict | None = None) -> tuple[str, ...]:
    """The modules a cell of `kind` and `method` starts from: the engine, the kind's function's module, and the module
    that registers each method it runs (a plugin's, wherever it lives): the run's, the kind's `also_runs`, and any
    registered method a run option names (a benchmark's `pipelines=gpipe,pipedream-flush`). A method not registered
    here adds none."""
    out = [*ENGINE]
    methods = [method]
    if kind in KINDS:
        out.append(KINDS.entry(kind).where.partition(":")[0])
        methods += KINDS.entry(kind).also_runs
    for value in (options or {}).values():  # (a listed or registered name only: no word of an option is looked for)
        if isinstance(value, str):
            methods += [m for m in value.split(",") if m in registry.METHODS or registry.is_loaded(m)]
    for name in dict.fromkeys(m for m in methods if m):
        if registry.is_registered(name):
            out.append(registry.get(name).__module__)
    return tuple(out)


def code_of(kind: str, method: str | None, options: dict | None = None) -> dict:
    """`code` (the digest) and `code_files` (each file and its digest) of a cell of `kind` running `method` with the
    run's `options`, as the files are now: what a record of such a cell states in its provenance."""
    files = sources.files(roots(kind, method, options), skip=NOT_CODE)
    return {"code": sources.digest(files), "code_files": files}


def code_of_payload(payload: dict) -> dict:
    """code_of the cell a payload (Cell.resolved()) describes, as a cell process or the worker reads it."""
    run = payload.get("run") or {}
    return code_of(payload.get("kind", "throughput"), run.get("method"), run.get("options"))
