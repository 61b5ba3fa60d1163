"""Cell kinds by name: the function that runs a cell of each kind, and what the runner must know of it beforehand."""

from __future__ import annotations

from dataclasses import dataclass

from suite.core.catalogue import Catalogue, Entry


@dataclass(frozen=True)
class CellKind(Entry):
    """A cell kind: `where` names its function (run, device, cap) -> metrics dict. `timed`: its throughput is the
    cell's figure, so a sweep measures it in interleaved rounds. `builds_method`: False where the cell never
    builds its method (a projection), so there is nothing of the method to check before launch. `one_process`:
    launched as one process whatever the method's rank count (a count follows the ranks itself). `watched`: a
    benchmark whose figures are times of its own: the machine's load over the whole cell is recorded with them
    (suite.measure.contention; a timed kind records it over its timed steps). `on_host`: it runs on the host's CPU
    whatever device the run names (fake tensors, or arithmetic alone: a roofline), so a count or projection for a GPU
    can be made where there is none. `projected`: its figures are a projection (a model's arithmetic on stated
    rates), never a measurement: its tables say so beside each figure. `also_runs`: the methods its function builds
    besides the run's own (a benchmark's reference), part of its cells' code (suite.core.cell_code)."""

    timed: bool = False
    builds_method: bool = True
    one_process: bool = False
    watched: bool = False
    on_host: bool = False
    projected: bool = False
    also_runs: tuple[str, ...] = ()


# A new kind is one line here and its function where it belongs; the function is imported when a cell runs.
KINDS = Catalogue(
    "cell kind",
    [
        ("throughput", CellKind("suite.core.cell:throughput_cell", timed=True)),
        ("throughput-rounds", CellKind("suite.core.cell:throughput_rounds_cell", timed=True)),
        ("count", CellKind("suite.core.cell:count_cell", one_process=True, on_host=True)),
        ("count-vs-measured", CellKind("experiments.counted_vs_cuda:count_and_measure", one_process=True)),
        ("finetune", CellKind("suite.tasks.finetune:finetune_cell")),
        ("pretrain", CellKind("suite.tasks.pretrain:pretrain_cell", also_runs=("grad_accum",))),
        ("all-ranks-throughput", CellKind("experiments.table4:all_ranks_throughput", timed=True)),
        ("planned", CellKind("methods.pipeline.planner.check:planned_cell", watched=True)),
        (
            "projected",
            CellKind("methods.pipeline.planner.projection:projected_cell", builds_method=False, projected=True),
        ),
        ("decoder-largest", CellKind("experiments.decoder_largest:largest", one_process=True, on_host=True)),
        ("l2l-projected", CellKind("experiments.l2l_projection:projected_cell", builds_method=False, projected=True)),
        (
            "roofline",
            CellKind(
                "experiments.decoder_8b_roofline:roofline_cell", builds_method=False, on_host=True, projected=True
            ),
        ),
        (
            "count-search",
            CellKind("methods.pipeline.planner.largest:largest_counted", one_process=True, on_host=True),
        ),
        (
            "bench-overhead",
            CellKind("experiments.benchmarks.overhead:overhead_cell", builds_method=False, watched=True),
        ),
        (
            "bench-host-optim",
            CellKind("experiments.benchmarks.host_optim:host_optim_cell", builds_method=False, watched=True),
        ),
        ("bench-link", CellKind("experiments.benchmarks.link:link_cell", builds_method=False, watched=True)),
        ("bench-l2l-host-step", CellKind("experiments.benchmarks.l2l_host_step:host_step_cell", watched=True)),
        (
            "bench-pipeline",
            CellKind(
                "experiments.benchmarks.pipeline_vs_torch:pipeline_bench_cell", watched=True, also_runs=("grad_accum",)
            ),
        ),
    ],
)


def kind(name: str) -> CellKind:
    """The kind called `name` (an unknown one is a one-line ConfigError)."""
    return KINDS.entry(name)


def is_timed(name: str) -> bool:
    return name in KINDS and kind(name).timed


def is_projected(name: str | None) -> bool:
    return name in KINDS and kind(name).projected
