"""The shape of a cell's record, written once: every key, its type and what it means; checked when a record is read."""

# No `from __future__ import annotations` here: TypedDict reads NotRequired from evaluated annotations (3.11 does
# not from strings).
import re
import types
import typing
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any, NotRequired, TypedDict

from suite.config import paths

# The schema's version, saved with every record as `schema`; a record without one predates the field (version 1).
SCHEMA_VERSION = 1

# Metrics that are numbers wherever a record has them (None where a cell has none): a string there would read as a
# blank in its table.
NUMERIC_METRICS = (
    "throughput", "memory_gb", "memory_reserved_gb", "host_peak_gb", "step_time_median", "step_time_min",
    "step_time_max", "final_loss", "mfu", "hfu", "score", "device_busy", "model_tflops", "hardware_tflops",
    "tokens_per_s", "tflops_6n",
)  # fmt: skip
STATUSES = ("ok", "oom", "timeout", "not_implemented")  # or "error: <message>", "partial: k/n rounds", "pending: ..."
FINISHED = ("ok", "oom")  # a re-run skips these; error, timeout, partial and not_implemented are tried again


class Outcome(TypedDict):
    """What a cell's process returns (or the runner writes for it): exactly one status, and what it measured."""

    status: str  # one of STATUSES, "error: <type>: <message>", "partial: k/n rounds" or "pending: <why>"
    metrics: dict[str, Any]  # the cell kind's figures (throughput, memory_gb, step_time_median, score, history, ...)
    error: NotRequired[str | None]  # the traceback's or the log's tail where the cell failed
    provenance: dict[str, Any] | None  # suite.measure.provenance: commit, versions, device, cap, methodology
    duration_s: NotRequired[float]  # wall time of the cell's process, summed over its rounds
    rounds: NotRequired[int]  # timing rounds measured (the median of their rates is the figure)
    round_records: NotRequired[list]  # a partial record's measured rounds, kept so that a later call resumes them
    rank0_node: NotRequired[int]  # across nodes: the node whose rank 0 wrote the outcome


class Record(Outcome):
    """An outcome labelled with its cell, machine and sweep, as saved under results/runs/<machine>/<key>.json."""

    key: str  # the hash of the cell's resolved config: its identity (suite.core.experiment.Cell.key)
    experiment: str
    row: str
    method: str
    profile: str  # tiny | small | paper
    device_type: str  # cpu | cuda
    variant: str  # what differs from the experiment's default run ("" for the default)
    settings: NotRequired[list[str]]  # the command-line flags that reproduce its cell (SweepRequest.settings)
    config: dict[str, Any]  # the cell's resolved config (Cell.resolved())
    finished: str  # ISO time the record was last written
    machine: NotRequired[dict[str, Any]]  # suite.measure.machine.fingerprint(); absent in records that predate it
    sweep: NotRequired[str]  # the sweep it was measured in: ratios are taken within one sweep only
    wandb_dir: NotRequired[str | None]  # the offline W&B run of the cell, relative to the results folder
    migrated: NotRequired[list]  # what the store's migrations changed (suite/records/migrate.py)
    # A partial record of another code, set aside under runs/<machine>/earlier/ when a measurement of the new code
    # replaced it: why, and by what (its measured rounds are kept there, never folded into the new record)
    set_aside: NotRequired[str]
    schema: NotRequired[int]  # SCHEMA_VERSION when written; absent before the field (version 1)
    # A record made by code from an earlier result file, not by the runner: the file, its commit, what made it.
    converted_from: NotRequired[dict[str, Any]]
    # The record of another table's cell with this very config, reused (suite.core.experiment.Row.same_as).
    reused_from: NotRequired[dict[str, Any]]


@dataclass(frozen=True)
class Status:
    """A record's status, read once, here only: its `kind` (one of STATUSES, or error, partial, pending, skipped:
    the word before a colon) and its `detail` (what follows the colon: the message, `k/n rounds`, why)."""

    kind: str
    detail: str = ""

    @property
    def finished(self) -> bool:
        """ok or oom: a re-run skips it (its figures, or its out-of-memory verdict, stand)."""
        return self.kind in FINISHED

    @property
    def measured(self) -> bool:
        """ok, or partial (the rounds measured before a call ended): figures a table shows as measured."""
        return self.kind in ("ok", "partial")

    @property
    def unfinished(self) -> bool:
        """partial or pending: the same command goes on with it."""
        return self.kind in ("partial", "pending")


def status_of(record: Any) -> Status:
    """The Status of a record, an outcome or a status string (an empty one where there is none)."""
    text = record.get("status") if isinstance(record, dict) else record
    kind, _, detail = str(text or "").partition(":")
    return Status(kind.strip(), detail.strip())


def failed(status: str, error: str | None = None, metrics: dict | None = None) -> Outcome:
    """The outcome of a cell that measured nothing itself (it failed, timed out, was left, or is not run): its one
    status, why, and any figures that speak for it (a count's)."""
    return {"status": status, "metrics": dict(metrics or {}), "error": error, "provenance": None}


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is NotRequired:
        return _matches(value, typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def absolute(path: Any) -> bool:
    """Whether a path a record holds is absolute (on any system): one machine's folder, not the results folder's."""
    return isinstance(path, str) and (PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute())


def problems(record: Any, shape: type = Record) -> list[str]:
    """What keeps `record` from matching `shape` (none when it matches): missing keys, wrong types, a newer schema."""
    if not isinstance(record, dict):
        return [f"a {type(record).__name__}, not an object"]
    hints = typing.get_type_hints(shape, include_extras=True)
    out = [f"no {k!r}" for k in sorted(shape.__required_keys__) if k not in record]
    out += [
        f"{k!r} is a {type(record[k]).__name__}"
        for k, hint in hints.items()
        if k in record and not _matches(record[k], hint)
    ]
    metrics = record.get("metrics")
    if isinstance(metrics, dict):
        out += [
            f"metric {k!r} is a {type(metrics[k]).__name__}"
            for k in NUMERIC_METRICS
            if k in metrics and metrics[k] is not None and not _matches(metrics[k], float)
        ]
    sweep = record.get("sweep")
    if isinstance(sweep, str) and not paths.plain(sweep):
        out.append(f"sweep {sweep[:60]!r} is not a plain name (a file name is made of it)")
    out += _config_problems(record.get("config"))
    if absolute(record.get("wandb_dir")):
        out.append("wandb_dir is an absolute path (a record keeps it relative to the results folder)")
    version = record.get("schema", 1)
    if isinstance(version, int) and not isinstance(version, bool) and version < 1:
        out.append(f"schema {version} is not one this suite reads (1 to {SCHEMA_VERSION})")
    if newer(record):
        out.append(f"schema {record['schema']} is newer than this suite's {SCHEMA_VERSION}")
    return out


def _config_problems(config: Any) -> list[str]:
    """A record's config without a run object, or keys of its run configuration that this suite's RunConfig (and
    ModelConfig) do not have: such a record cannot be read back as a run (a table's labels, the estimate), so it is
    set aside like any off the schema."""
    from dataclasses import fields

    from suite.config.run import ModelConfig, RunConfig

    if not isinstance(config, dict):
        return []  # (its type is the schema's to name)
    run = config.get("run")
    if not isinstance(run, dict):  # every reader reads a row back from it: a table, the estimate, the labels
        return ["config has no run object (the run configuration its row is read back from)"]
    out = [f"config.run has {k!r}, which no run has" for k in sorted(run.keys() - {f.name for f in fields(RunConfig)})]
    model = run.get("model")
    if isinstance(model, dict):
        known = {f.name for f in fields(ModelConfig)}
        out += [f"config.run.model has {k!r}, which no model has" for k in sorted(model.keys() - known)]
    return out


def newer(record: Any) -> bool:
    """Whether `record` was written by a newer suite (a schema past this one's): never read, never written over."""
    version = record.get("schema") if isinstance(record, dict) else None
    return isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION


def metrics_of(record: Record | None) -> dict[str, Any]:
    """A row's metrics, or none where the row has no record (not run on that machine)."""
    return record["metrics"] if record is not None else {}


def machine_of(record: Record) -> str:
    """The slug of the machine a record came from; records made before fingerprints are named by their provenance."""
    if record.get("machine", {}).get("slug"):
        return record["machine"]["slug"]
    device = (record["provenance"] or {}).get("device") or "unknown device"
    return "unfingerprinted-" + "-".join(re.findall(r"[A-Za-z0-9_]+", device)).lower()
