"""How multi-rank processes start: the one place that builds the torchrun command, on this machine or on several.

One node (the default): `torchrun --standalone --nproc_per_node=N`. Several nodes: every node starts the same
`torchrun --nnodes=K --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=ID --nproc_per_node=N/K`, and the
c10d rendezvous at HOST:PORT joins their agents into one world of N ranks. The settings come from the command line
(`--nnodes`, `--node-rank`, `--rdzv-endpoint`, `--rdzv-id`) or from SUITE_NNODES, SUITE_NODE_RANK,
SUITE_RDZV_ENDPOINT and SUITE_RDZV_ID.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from suite.config.errors import ConfigError

ENV = {
    "nnodes": "SUITE_NNODES",
    "node_rank": "SUITE_NODE_RANK",
    "endpoint": "SUITE_RDZV_ENDPOINT",
    "rdzv_id": "SUITE_RDZV_ID",
}
OPTION = {"nnodes": "--nnodes", "node_rank": "--node-rank", "endpoint": "--rdzv-endpoint", "rdzv_id": "--rdzv-id"}
_ID = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Nodes:
    """Where a multi-rank launch runs: `nnodes` machines, this one being `node_rank` (node 0 sits at the
    rendezvous `endpoint`, HOST:PORT, and writes the records), and the rendezvous id (prefix) `rdzv_id`."""

    nnodes: int = 1
    node_rank: int | None = None
    endpoint: str | None = None
    rdzv_id: str = "suite"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given) -> Nodes:
        """The settings from the SUITE_* variables, each overridden by `given` (command-line options; None where
        the option was not given). Not validated: call validate()."""
        environ = os.environ if environ is None else environ
        values = {}
        for field, var in ENV.items():
            value = given.get(field)
            if value is None and environ.get(var, "").strip():
                value = environ[var].strip()
            if value is not None and field in ("nnodes", "node_rank"):
                try:
                    value = int(value)
                except ValueError:
                    raise ConfigError(f"{OPTION[field]} {value!r} (or {var}): give a whole number") from None
            if value is not None:
                values[field] = value
        return cls(**values)

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = (self.endpoint or "").rpartition(":")
        return host.strip("[]"), int(port)

    def validate(self, needs_node_rank: bool = True) -> Nodes:
        """One-line ConfigErrors naming the bad setting and what is accepted. `needs_node_rank`: a sweep must
        know which node writes the records (node 0); `suite check` needs no node rank (torchrun numbers the ranks)."""
        n = self.nnodes
        if n < 1:
            raise ConfigError(f"--nnodes {n}: give 1 (this machine alone, the default) or more nodes")
        if n == 1:
            extra = [OPTION[f] for f in ("node_rank", "endpoint") if getattr(self, f) is not None]
            if extra:
                verb = "applies" if len(extra) == 1 else "apply"
                raise ConfigError(f"{' and '.join(extra)} {verb} to several nodes only: add --nnodes 2 (or more)")
            return self
        if self.endpoint is None:
            raise ConfigError(
                f"--nnodes {n} needs --rdzv-endpoint HOST:PORT (or {ENV['endpoint']}): node 0's address and a free "
                "port, e.g. node0.example:29500"
            )
        host, _, port = self.endpoint.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(
                f"--rdzv-endpoint {self.endpoint!r}: give HOST:PORT with a port 1-65535, e.g. node0.example:29500"
            )
        if not _ID.fullmatch(self.rdzv_id):
            raise ConfigError(f"--rdzv-id {self.rdzv_id!r}: give letters, digits, '_', '.' or '-'")
        if needs_node_rank and self.node_rank is None:
            others = "1 on the other" if n == 2 else f"1..{n - 1} on the others"
            raise ConfigError(
                f"--nnodes {n} needs --node-rank (or {ENV['node_rank']}): 0 on the machine of --rdzv-endpoint "
                f"(it writes the records), {others}"
            )
        if self.node_rank is not None and not 0 <= self.node_rank < n:
            raise ConfigError(f"--node-rank {self.node_rank} with --nnodes {n}: give 0..{n - 1}, one per node")
        return self

    def ranks_per_node(self, world: int, what: str = "") -> int:
        """How many of `world` ranks each node starts; a ConfigError (prefixed by `what`) when they do not split."""
        if world % self.nnodes:
            fits = [k for k in range(1, world + 1) if world % k == 0]
            raise ConfigError(
                f"{what}{world} rank(s) do not split evenly over --nnodes {self.nnodes}: every node starts the same "
                f"number of ranks; give --nnodes {' or '.join(map(str, fits))}"
            )
        return world // self.nnodes


def torchrun_command(
    world: int,
    module: str,
    args: list[str],
    nodes: Nodes | None = None,
    rdzv_id: str | None = None,
    store_held: bool = False,
) -> list[str]:
    """`python -m torch.distributed.run ... -m module *args` for `world` ranks: standalone on this machine, or
    this node's share of them when `nodes` spans several (`rdzv_id`, default nodes.rdzv_id, names the launch;
    `store_held`: node 0's sweep already holds the rendezvous store at the endpoint, so no agent hosts one)."""
    launcher = [sys.executable, "-m", "torch.distributed.run"]
    if nodes is None or not nodes.multi:
        return launcher + ["--standalone", f"--nproc_per_node={world}", "-m", module, *args]
    launcher += [
        f"--nnodes={nodes.nnodes}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={nodes.endpoint}",
        f"--rdzv-id={rdzv_id or nodes.rdzv_id}",
    ]
    if store_held:
        launcher.append("--rdzv-conf=is_host=false")
    return launcher + [f"--nproc_per_node={nodes.ranks_per_node(world)}", "-m", module, *args]
