"""What one sweep is asked to do: built once (by the command line or the campaign), checked at once, passed down
unchanged."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.launch import Nodes
from suite.config.run import MEASURES
from suite.core.experiment import Experiment, resolve_profile
from suite.records import tracking

MAX_ROUNDS = 1000  # timing rounds a sweep may ask for: more is a typo (--rounds 10**20 counted, then spun for ever)
STALE_CHOICES = ("measure", "keep", "only")  # what a sweep does with finished timed records of another code


@dataclass(frozen=True)
class SweepRequest:
    """One experiment at one profile: which rows (`only`: names or shell patterns), re-run finished cells or not
    (`force`), a device-memory cap and `--set` overrides, the W&B mode, where records go, seconds per cell
    (`timeout`, else the experiment's), timing rounds (else the experiment's), a `deadline` (epoch seconds) past
    which no cell-round starts, the nodes a multi-rank cell spans, whether memory is measured or counted
    (`measure`: time | count), and whether single-rank throughput cells share one long-lived `worker` process
    (each model shape built once) instead of a fresh process each, and whether capped cells are counted first
    (`precount`: one past its cap is recorded without running). Bad values are one-line ConfigErrors when it
    is made, before anything runs; the defaults are resolved then too ('auto' profile, rounds, W&B mode, results
    folder)."""

    experiment: Experiment
    profile: str = "auto"
    only: tuple[str, ...] | None = None
    force: bool = False
    device_memory: str | None = None
    overrides: tuple[str, ...] | None = None
    wandb_mode: str | None = None
    results_dir: Path | None = None
    timeout: float | None = None
    rounds: int | None = None
    deadline: float | None = None
    nodes: Nodes | None = None
    measure: str = "time"
    worker: bool = False  # single-rank throughput cells in one long-lived process (suite.core.worker)
    precount: bool = False  # count capped cells first: those past their cap are recorded `oom` (counted), not run
    # A finished timed record of another code (suite.core.plan.stale_reason): `measure` it again (the default),
    # `keep` it as it is, or measure `only` those and leave every other cell as it stands.
    stale: str = "measure"
    # Measure again only the rows whose finished timed record was contended (the machine was busy), with their
    # reference; leave every other cell as it stands (`suite run X --contended`).
    contended: bool = False

    def __post_init__(self):
        def resolve(field: str, value) -> None:
            object.__setattr__(self, field, value)

        resolve("results_dir", Path(self.results_dir or paths.RESULTS_DIR))
        resolve("profile", resolve_profile(self.profile))
        resolve("only", tuple(self.only) if self.only else None)
        resolve("overrides", tuple(self.overrides) if self.overrides else None)
        resolve("rounds", self.experiment.rounds if self.rounds is None else self.rounds)
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ConfigError(
                f"--rounds {self.rounds}: give 1 to {MAX_ROUNDS} timing rounds (3 or more to see the noise)"
            )
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ConfigError(f"--timeout {self.timeout}: give a positive number of seconds a cell may take")
        if self.measure not in MEASURES:
            raise ConfigError(f"--measure {self.measure!r}: accepted: {', '.join(MEASURES)}")
        if self.stale not in STALE_CHOICES:
            raise ConfigError(f"stale={self.stale!r}: accepted: {', '.join(STALE_CHOICES)}")
        if self.contended and (self.force or self.stale == "only"):
            raise ConfigError(
                "--contended measures the contended rows again and leaves the rest: drop "
                + ("--force" if self.force else "--only-stale")
            )
        resolve("nodes", (self.nodes or Nodes()).validate())
        resolve("wandb_mode", tracking.resolve_mode(self.wandb_mode))

    @property
    def follower(self) -> bool:
        """A node other than 0 of a sweep across nodes: it runs its share of node 0's launches and writes nothing."""
        return self.nodes.multi and bool(self.nodes.node_rank)

    @property
    def variant(self) -> str:
        """What makes this sweep's runs differ from the experiment's default at its profile (empty for the default)."""
        parts = ["counted (fake tensors), not measured"] if self.measure == "count" else []
        parts += [f"device_memory={self.device_memory}"] if self.device_memory else []
        parts += [f"nnodes={self.nodes.nnodes}"] if self.nodes.nnodes > 1 else []
        return ", ".join(parts + [f"set {o}" for o in self.overrides or []])

    @property
    def settings(self) -> list[str]:
        """The command-line flags that make this sweep's cells what they are, the profile's aside: its cap, `--set`
        overrides, whether memory is counted (a printed command that measures them again carries these, and each
        record keeps them)."""
        flags = ["--device-memory", self.device_memory] if self.device_memory else []
        for o in self.overrides or ():
            flags += ["--set", o]
        return flags + (["--measure", "count"] if self.measure == "count" else [])
