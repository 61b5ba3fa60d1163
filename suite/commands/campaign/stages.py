"""The campaign's stages: what each call of one lent GPU's command runs, in the order of what it settles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from suite.config.errors import ConfigError
from suite.core.experiment import Cell, get_experiment
from suite.core.request import SweepRequest

BUDGET_S = 540.0  # a stage's default: inside the GPU machine's 10-minute command limit, with a margin


def counted_cells() -> list[Cell]:
    """The counted-against-measured test's cells (tests/test_counting_cuda.py), as a GPU resolves them: the
    counted-vs-cuda experiment's, whose records the README's first claim reads (experiments/counted_vs_cuda.py)."""
    return get_experiment("counted-vs-cuda").cells("paper", None, ["device=cuda"])


@dataclass(frozen=True)
class Sweep:
    """One experiment's cells at the campaign's profile (`only` rows, or all); `dry_only` rows and `dry_set`
    overrides at the dry run."""

    experiment: str
    only: tuple[str, ...] | None = None
    dry_only: tuple[str, ...] = ()
    dry_set: tuple[str, ...] = ()
    fresh: bool = False  # every cell in a process of its own, never the worker's (a model that fills the host)

    def request(
        self,
        dry: bool = False,
        rounds: int | None = None,
        worker: bool = True,
        results_dir: Path | None = None,
        deadline: float | None = None,
        wandb_mode: str | None = "off",
        as_on_gpu: bool = False,
    ) -> SweepRequest:
        """The sweep a stage runs (its rows, at `paper` on a GPU or `tiny` in the dry run, capped cells counted
        first), and the estimate plans: the estimate's, made on any machine, resolves its cells as the GPU does
        (`as_on_gpu`: device=cuda, which 'auto' is there), so that they have the keys the GPU records under."""
        overrides = list(self.dry_set) if dry else []
        return SweepRequest(
            get_experiment(self.experiment),
            profile="tiny" if dry else "paper",
            only=list(self.dry_only) if dry else (list(self.only) if self.only else None),
            overrides=[*overrides, "device=cuda"] if as_on_gpu else overrides,
            wandb_mode=wandb_mode,
            results_dir=results_dir,
            rounds=1 if dry else rounds,
            deadline=deadline,
            worker=worker and not self.fresh,
            precount=True,
        )


@dataclass(frozen=True)
class Stage:
    """What one call of at most BUDGET_S seconds runs, in order; a stage cut at its deadline resumes."""

    title: str
    sweeps: tuple[Sweep, ...] = ()
    cuda_tests: bool = False
    bench: bool = False
    counted: bool = False
    counted_cells: Callable[[], list[Cell]] | None = None  # what the counted test runs (for the estimate)
    notes: tuple[str, ...] = field(default=())


# In the order of what a lent GPU's minutes are worth (the tests first, then inner looping, the paper's headline
# table, depth), each stage one command; a session of 15 device minutes runs stage 1 and one or two more.
STAGES = {
    1: Stage(
        "environment report, every cuda test, counted against measured, L2L's microbenchmarks",
        cuda_tests=True,
        counted=True,
        counted_cells=counted_cells,
        bench=True,
    ),
    2: Stage(
        "L2L Table 3 (inner looping against AMP recomputing per layer), Table 4's one-GPU rows and Table 6, "
        "paper profile (BERT-Large shapes, random weights) under the 16 GB cap",
        sweeps=(
            Sweep("table3", dry_only=("l2l-cmp-u1",)),
            Sweep("table4", only=("1-rank-u1", "1-rank-u2", "1-rank-u4"), dry_only=("1-rank-u1",)),
            Sweep("table6", dry_only=("turing-17b",)),
        ),
    ),
    3: Stage(
        "L2L Table 2 with the relay's settings varied in the same rounds, and the host-optimizer benchmark",
        sweeps=(
            Sweep("table2", dry_only=("baseline-fp32", "l2l-cmp-overlap")),
            # The layer rows only: the whole model's rows take minutes of host time each, past a stage's budget
            # (`suite run bench-host-optim --only 'model-*'` runs them on their own).
            Sweep("bench-host-optim", only=("layer-1-thread", "layer-all-threads"), dry_only=("layer-1-thread",)),
        ),
    ),
    4: Stage(
        "L2L Table 5 to 384 layers and the harness's overhead benchmark",
        sweeps=(
            Sweep("table5", dry_only=("stash-cpu-x1",)),
            Sweep("bench-overhead", dry_set=("steps=2", "warmup=1", "rounds=2")),
        ),
    ),
    5: Stage(
        "Llama 3.2 1B and 3B at 4096 tokens in bf16 (AMP, L2L-CMP, FSDP2), 80 GB: tokens/s, TFLOPS, MFU",
        sweeps=(
            Sweep(
                "decoder",
                # The precision Llama trains in: the FP32 rows (AG, L2L) stay counted (results/decoder.md); on a GPU
                # `python -m suite run decoder --profile paper --only '1b-ag-fp32-80GB'` measures one.
                only=tuple(f"{size}-{m}-80GB" for size in ("1b", "3b") for m in ("amp", "l2l-cmp", "fsdp")),
                dry_only=("1b-l2l-cmp-80GB",),
                dry_set=("model.preset=llama-tiny", "seq_len=32"),
            ),
        ),
    ),
    6: Stage(
        "Llama 3 8B on one GPU: the roofline's rates (bench-link: the link, the host's triad and its update); L2L-CMP "
        "at 8B with AdamW on the host and on the device (issue 63: the roofline's choice on each kind), each cell 3 "
        "rounds of 2 steps in the process that built its model",
        sweeps=(
            Sweep("bench-link", dry_only=("block",)),
            Sweep(
                "decoder-8b",
                only=("8b-l2l-cmp", "8b-l2l-cmp-device"),
                dry_only=("8b-l2l-cmp", "8b-l2l-cmp-device"),
                dry_set=("steps=1",),
                fresh=True,
            ),
        ),
    ),
    7: Stage(
        "Llama 3 8B on one GPU, the rest: L2L-CMP clipped at 1.0 (its norm on the device), and at 8 of its layers "
        "beside AMP resident; FSDP2's offload at 8B, refused by its count where its host need passes this host's",
        sweeps=(
            Sweep(
                "decoder-8b",
                only=("8b-l2l-cmp-clip", "8b-8l-amp", "8b-8l-l2l-cmp-cache", "8b-fsdp"),
                dry_only=("8b-2l-amp", "8b-2l-l2l-cmp-cache", "8b-l2l-cmp-clip"),
                dry_set=("steps=1",),
                fresh=True,
            ),
        ),
    ),
}


def stage_numbers(text: str) -> list[int]:
    """`all` (every stage, in order) or one stage's number; anything else is one line naming what is accepted."""
    if text == "all":
        return sorted(STAGES)
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number not in STAGES:
        raise ConfigError(f"--stage {text!r}: give one of {sorted(STAGES)} or 'all'")
    return [number]
