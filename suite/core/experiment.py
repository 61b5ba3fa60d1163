"""Experiment definitions: rows with the paper's values, per-profile configs, and the cells they expand to."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from suite.config.errors import ConfigError, did_you_mean
from suite.config.run import RunConfig, apply_overrides, override_keys
from suite.core import registry
from suite.core.catalogue import Catalogue, Entry
from suite.core.kinds import CellKind, kind
from suite.harness import rng
from suite.harness.device import device_type
from suite.measure.step import METHODOLOGY_VERSION

PROFILES = ("tiny", "small", "paper", "auto")


def resolve_profile(name: str) -> str:
    """'auto' is `paper` on a CUDA machine and `tiny` on a CPU one."""
    if name not in PROFILES:
        raise ConfigError(
            f"unknown profile {name!r}{did_you_mean(name, PROFILES)}; accepted profiles: {', '.join(PROFILES)}"
        )
    if name == "auto":
        return "paper" if torch.cuda.is_available() else "tiny"
    return name


@dataclass
class Metric:
    """A measured column: summary key, label, and whether the table shows a ratio to the baseline row."""

    key: str
    label: str
    fmt: str = "{:.2f}"
    ratio: bool = True
    paper: bool = True  # False where the paper has no such number (a column of dashes says nothing)
    unit: str | None = None  # "GB": values in GB, shown in one unit per section that reads well at its scale
    brief: bool = True  # in each section's compact table (False: only in its table of every column)


@dataclass
class Row:
    """One row of a paper table: the method, its overrides (method options included), display labels,
    the paper's values, and `skip`: why the row cannot run at this profile (it stays in the table)."""

    name: str
    method: str
    overrides: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    paper: dict[str, float | str | None] = field(default_factory=dict)
    skip: str | None = None
    # The skip is this machine's memory, which a count (fake tensors) never allocates: counted all the same.
    count_anyway: bool = False
    # (experiment, row) whose cell runs this very config (another table's row): its finished record on this machine
    # is reused, its metrics passed through `adapt` (what this row's cell kind adds), instead of measuring it again.
    same_as: tuple[str, str] | None = None
    adapt: Callable[[dict], dict] | None = None


@dataclass
class Cell:
    """One (row, resolved config) point of an experiment at a profile."""

    experiment: str
    row: Row
    run: RunConfig
    profile: str
    kind: str = "throughput"
    timeout: float = 600.0
    nnodes: int = 1  # the machines of its sweep (suite run --nnodes): a sweep across nodes makes records of its own
    # The --set pairs that change what the table's rows run (Experiment.cells: variant_pairs), as `set k=v, ...`;
    # a variant's cells are keyed apart, its reference row (run as the table defines it) included
    variant: str = ""

    def resolved(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "row": self.row.name,
            "profile": self.profile,
            "kind": self.kind,
            "run": self.run.to_dict(),
            "methodology": METHODOLOGY_VERSION,
            # The keyed dropout's draws where they are not the first harness's (the counter hash on CUDA).
            **rng.harness_key(device_type(self.run.device)),
            **({"nnodes": self.nnodes} if self.nnodes > 1 else {}),  # keys of one-node cells stay as they were
            **({"variant": self.variant} if self.variant else {}),  # and those of the table's own rows
        }

    @functools.cached_property
    def spec(self) -> CellKind:
        """The cell's kind (what the runner must know of it), resolved once."""
        return kind(self.kind)

    @functools.cached_property
    def method_class(self) -> type[registry.Method] | None:
        """The class of the cell's method, resolved once; None where no method of that name is registered."""
        return registry.get(self.run.method) if registry.is_registered(self.run.method) else None

    @functools.cached_property
    def world(self) -> int:
        """How many ranks the cell runs on (through torchrun when more than one); a count takes every rank in one."""
        if self.spec.one_process or self.method_class is None:
            return 1
        return self.method_class.world_size(self.run)

    @property
    def code(self) -> dict:
        """The code the cell runs as its files are now (suite.core.cell_code.code_of): `code` and `code_files`, what
        its record states in its provenance where this code measured it."""
        from suite.core.cell_code import code_of

        return code_of(self.kind, self.run.method, self.run.options)

    @property
    def key(self) -> str:
        """Hash of the fully resolved config: the cell's identity in results/runs/."""
        blob = json.dumps(self.resolved(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Experiment:
    """A paper table or figure: its rows per profile, the metrics, and the row ratios are taken against."""

    name: str
    title: str
    source: str
    metrics: list[Metric]
    label_columns: list[str]
    baseline: str
    rows: Callable[[str], list[Row]]
    base: Callable[[str], dict[str, Any]]
    notes: str = ""
    kind: str = "throughput"
    timeout: Callable[[str], float] = lambda profile: 1800.0 if profile == "paper" else 600.0
    figure: Callable | None = None
    rounds: int = 3  # timing rounds of each throughput cell, interleaved across the cells (ABC ABC ABC)
    # Markdown lines under each section's table, from its cells and records (a benchmark's own table of one cell).
    detail: Callable[[list, list], list[str]] | None = None
    # Settings of this experiment's cells that no method declares (a benchmark's rounds): rows, profiles and
    # `--set` give them like a method's options, and they land in the run's options.
    settings: dict[str, registry.Option] = field(default_factory=dict)
    # For an experiment that reads a folder of data (`--data-dir`): what is wrong with a folder given, or None.
    # Experiments without it read none, and refuse one.
    data_check: Callable[[str], str | None] | None = None
    # The label columns that follow from what a cell ran (a variant's `--set` changes them), from its run config:
    # a table shows these from each record's config, never the row's definition for a run that differs from it.
    labels_of: Callable[[Any], dict[str, Any]] | None = None
    # What a row is held to that other records give (a projection's measured or published reference, its error),
    # read when its table is rendered, never frozen in its own record: (run, metrics, index) -> metrics to add.
    held_to: Callable[[Any, dict, Any], dict[str, Any]] | None = None

    def cells(
        self,
        profile: str,
        only: list[str] | None = None,
        overrides: list[str] | None = None,
        device_memory: str | None = None,
        counting: bool = False,
    ) -> list[Cell]:
        """Expand rows into validated cells; `only` selects rows by name, `overrides` are --set pairs; `counting`
        keeps the skipped rows a count can take all the same."""
        profile = resolve_profile(profile)
        rows = self.rows(profile)
        if only:
            names = [r.name for r in rows]
            for o in only:  # a name, or a shell pattern ('mrpc-*') that matches at least one
                if not fnmatch.filter(names, o):
                    raise ConfigError(
                        f"experiment {self.name} has no row {o!r}{did_you_mean(o, names)}; rows: {', '.join(names)}"
                    )
            rows = [r for r in rows if any(fnmatch.fnmatchcase(r.name, o) for o in only)]
        takes = self._set_keys(rows, overrides or [])
        what_runs = self.variant_pairs(overrides or [])
        variant = ", ".join(f"set {p}" for p in what_runs)
        cells = []
        for row in rows:
            if row.skip and not (counting and row.count_anyway):
                continue
            pairs = {**self.base(profile), **row.overrides}
            if registry.is_registered(row.method):
                opts = registry.get(row.method).options
            else:  # a method still to come: keep its options unvalidated so the row records not_implemented
                opts = {k: _Raw() for k in pairs if k not in override_keys()}
            opts = {**self.settings, **opts}
            run = apply_overrides(RunConfig(method=row.method), pairs, opts)
            if overrides:  # a method's option goes to the rows whose method takes it (stash=cpu: the L2L rows)
                mine = [p for p in overrides if _key(p) in takes[row.method]]
                if row.name == self.baseline and len(rows) > 1:  # beside other rows, the reference runs as the
                    mine = [p for p in mine if p not in what_runs]  # table defines it (alone, it is the variant)
                run = apply_overrides(run, mine, opts)
            if device_memory is not None:
                run.device_memory = device_memory
            if run.device == "auto":  # resolve here so a CPU and a GPU result never share a cache key
                run.device = "cuda" if torch.cuda.is_available() else "cpu"
            cell = Cell(self.name, row, run.validate(), profile, self.kind, self.timeout(profile), variant=variant)
            cells.append(self.adapt(cell, profile))
        return cells

    def variant_pairs(self, overrides: list[str]) -> list[str]:
        """The --set pairs that change what a row runs, not the shape it runs at: its method, its precision, a
        method's options. A sweep with any is a variant of the table: its rows are keyed and shown apart from the
        table's own (a section of their own), never drawn in its figures, and its reference row, beside other rows,
        runs as the table defines it, so that each row is compared with the table's reference (selected alone, the
        reference row is the variant's row)."""
        shape = (set(override_keys()) | set(self.settings)) - set(WHAT_RUNS)
        return [p for p in overrides if _key(p) not in shape]

    def _set_keys(self, rows: list[Row], overrides: list[str]) -> dict[str, set[str]]:
        """The --set keys each row's method takes: the run's and the model's for all, a method option for the
        methods that declare it. A key that no selected row takes is refused, naming every key they do."""
        common = set(override_keys()) | set(self.settings)
        takes = {
            r.method: common | (set(registry.get(r.method).options) if registry.is_registered(r.method) else set())
            for r in rows
        }
        accepted = sorted(set().union(common, *takes.values()))
        for pair in overrides:
            if "=" not in pair:
                raise ConfigError(f"--set expects key=value, got {pair!r}")
        for key in {_key(p) for p in overrides}:
            if key not in accepted:
                raise ConfigError(
                    f"unknown --set key {key!r}{did_you_mean(key, accepted)}; the rows selected take: "
                    f"{', '.join(accepted)}"
                )
        return takes

    def adapt(self, cell: Cell, profile: str) -> Cell:
        """Hook for what a cell needs beyond its validated run: options no method declares (a GLUE task, a
        pre-training corpus, a projection), which `apply_overrides` would refuse, or another cell kind."""
        return cell


@dataclass
class ProjectedRow(Row):
    """A row predicted, not run: `projection` says what to project and joins the cell's options."""

    projection: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProjectingExperiment(Experiment):
    """Measured rows run as the experiment's kind; ProjectedRows as `projected_kind` cells carrying their projection
    (the 2BW planner's `projected`, L2L's `l2l-projected`).

    The projection goes in after validation, as table7's task does: `apply_overrides` takes only the method's
    declared options."""

    projected_kind: str = "projected"
    projected_timeout: float = 120.0  # seconds a projected cell may take (a search over counts takes minutes)

    def adapt(self, cell, profile):
        if not isinstance(cell.row, ProjectedRow):
            return cell
        run = dataclasses.replace(cell.run, options={**cell.run.options, "projection": cell.row.projection})
        return dataclasses.replace(cell, run=run, kind=self.projected_kind, timeout=self.projected_timeout)


WHAT_RUNS = ("method", "precision")  # of RunConfig's --set keys, those that change what runs, not its shape


def _key(pair: str) -> str:
    return pair.split("=", 1)[0].strip()


class _Raw:
    """Stands in for the Option of a method that is not registered yet: takes the value as given."""

    def parse(self, key: str, value: Any) -> Any:
        return value


# Every experiment by name: a new one is its module in experiments/ and one line here, imported when asked for.
EXPERIMENTS = Catalogue(
    "experiment",
    [
        (name, Entry(f"experiments.{module}:EXPERIMENT"))
        for name, module in (
            ("table2", "table2"),
            ("table3", "table3"),
            ("table4", "table4"),
            ("table5", "table5"),
            ("table6", "table6"),
            ("table7", "table7"),
            ("table7-recipe", "table7_recipe"),
            ("2bw-table1", "table1_2bw"),
            ("2bw-fig6", "fig6_2bw"),
            ("2bw-fig7", "fig7_2bw"),
            ("2bw-fig8", "fig8_2bw"),
            ("2bw-fig9", "fig9_2bw"),
            ("planner-check", "planner_check"),
            ("l2l-projection", "l2l_projection"),
            ("decoder", "decoder"),
            ("decoder-largest", "decoder_largest"),
            ("decoder-batch", "decoder_batch"),
            ("decoder-8b", "decoder_8b"),
            ("decoder-8b-roofline", "decoder_8b_roofline"),
            ("counted-vs-cuda", "counted_vs_cuda"),
            ("bench-overhead", "benchmarks.overhead"),
            ("bench-host-optim", "benchmarks.host_optim"),
            ("bench-link", "benchmarks.link"),
            ("bench-l2l-host-step", "benchmarks.l2l_host_step"),
            ("bench-pipeline", "benchmarks.pipeline_vs_torch"),
        )
    ],
)


def get_experiment(name: str) -> Experiment:
    """The experiment called `name`, its module imported now (an unknown name is a one-line ConfigError)."""
    exp = EXPERIMENTS.load(name)
    if exp.name != name:  # two entries may not load one definition under two names
        raise ConfigError(
            f"experiment {name!r} is entered at {EXPERIMENTS.entry(name).where}, which defines {exp.name!r}"
        )
    return exp


def all_experiments() -> dict[str, Experiment]:
    """Every experiment of the catalogue, by name."""
    return {name: get_experiment(name) for name in EXPERIMENTS.names()}
