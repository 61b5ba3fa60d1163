"""A sweep across nodes: node 0 runs the sweep and writes every record; the other nodes follow its launches.

Every node runs the same `suite run` (with its own --node-rank). Node 0 holds a TCP store at the rendezvous endpoint
for the whole sweep: torchrun's c10d rendezvous of each multi-rank launch runs in it (under an id of its own, so
one launch never meets another's agents), and node 0 posts each launch there before starting its own agent: the
cell's resolved config, its world size, timeout and rendezvous id. The other nodes start their agents for it and
post back what their node got: rank 0's record when c10d put rank 0 there (it orders nodes by host name and process
id, not by --node-rank), or nothing. Node 0 takes rank 0's record from wherever it was written and is the only node
that saves records, logs W&B runs and writes tables; a cell of one rank runs on node 0 alone.

Keys: `suite/node/R` (node R joined), `suite/launch/N` (the N-th launch, or null: the sweep is over),
`suite/record/N/R` (what node R got from launch N), `suite/bye/R` (node R read the end).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from suite.config.errors import ConfigError
from suite.config.launch import Nodes
from suite.core.experiment import Cell
from suite.core.process import launch
from suite.records.schema import Outcome, status_of

JOIN = timedelta(seconds=600)  # how long node 0 waits for the others to join, and they for node 0 to listen
IDLE = timedelta(days=1)  # how long a following node waits for node 0's next launch (single-rank cells run between)
BYE = timedelta(seconds=60)


class Coordinator:
    """Node 0's side (host) or another node's (join) of a multi-node sweep's store."""

    def __init__(self, nodes: Nodes, store: dist.TCPStore, progress=print):
        self.nodes, self.store, self.progress = nodes, store, progress
        self.posted = 0  # node 0: launches posted so far
        self._joined = False

    @classmethod
    def host(cls, nodes: Nodes, progress=print) -> Coordinator:
        host, port = nodes.host_port
        try:
            store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=False, timeout=JOIN)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"node 0 cannot listen at --rdzv-endpoint {nodes.endpoint} ({str(exc).splitlines()[0]}): give a free "
                "port of this machine (another sweep's node 0 may hold this one)"
            ) from None
        return cls(nodes, store, progress)

    @classmethod
    def join(cls, nodes: Nodes) -> Coordinator:
        host, port = nodes.host_port
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=JOIN)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"node {nodes.node_rank} found no node 0 at --rdzv-endpoint {nodes.endpoint} within "
                f"{JOIN.seconds} s ({str(exc).splitlines()[0]}): start the same `suite run` with --node-rank 0 there"
            ) from None
        if store.add(f"suite/node/{nodes.node_rank}", 1) > 1:
            raise ConfigError(
                f"another node already joined node 0 at {nodes.endpoint} as --node-rank {nodes.node_rank}: "
                f"give each node its own rank, 1..{nodes.nnodes - 1}"
            )
        return cls(nodes, store)

    @property
    def others(self) -> range:
        return range(1, self.nodes.nnodes)

    # Node 0.
    def post(self, launch: dict) -> int:
        """Post the next launch and return its number; before the first, wait for every node to join."""
        if not self._joined:
            keys = [f"suite/node/{r}" for r in self.others]
            if not self.store.check(keys):
                self.progress(
                    f"waiting for node(s) {', '.join(map(str, self.others))} to join at {self.nodes.endpoint} ..."
                )
            try:
                self.store.wait(keys, JOIN)
            except dist.DistError:
                missing = [r for r in self.others if not self.store.check([f"suite/node/{r}"])]
                raise ConfigError(
                    f"node(s) {missing} did not join at {self.nodes.endpoint} within {JOIN.seconds} s: start the same "
                    "`suite run` there with --node-rank " + " / ".join(map(str, missing))
                ) from None
            self._joined = True
        n, self.posted = self.posted, self.posted + 1
        self.store.set(f"suite/launch/{n}", json.dumps(launch, default=str))
        return n

    def record(self, n: int, timeout: float) -> tuple[int, dict] | None:
        """(node, rank 0's record) of launch `n` from the node that got rank 0, waiting up to `timeout` seconds
        for the others' reports; None when none has it."""
        deadline = time.monotonic() + timeout
        for r in self.others:
            try:
                self.store.wait([f"suite/record/{n}/{r}"], timedelta(seconds=max(deadline - time.monotonic(), 1)))
            except dist.DistError:
                continue
            got = json.loads(self.store.get(f"suite/record/{n}/{r}"))
            if got is not None:
                return r, got
        return None

    def finish(self, wait: bool = True) -> None:
        """Tell the other nodes the sweep is over and (`wait`, after a sweep that completed) give them a little time
        to join and read it before the store closes; one that finds the store closed stops with an error."""
        self.store.set(f"suite/launch/{self.posted}", "null")
        if wait:
            try:
                self.store.wait([f"suite/bye/{r}" for r in self.others], BYE)
            except dist.DistError:
                missing = [r for r in self.others if not self.store.check([f"suite/bye/{r}"])]
                self.progress(f"warning: node(s) {missing} did not read the end of the sweep within {BYE.seconds} s")

    # The other nodes.
    def launches(self) -> Iterator[tuple[int, dict]]:
        """Node 0's launches in order, until it posts the end (or goes away: a ConfigError)."""
        n = 0
        while True:
            key = f"suite/launch/{n}"
            try:
                self.store.wait([key], IDLE)
                launch = json.loads(self.store.get(key))
            except dist.DistError as exc:
                raise ConfigError(
                    f"node {self.nodes.node_rank} lost node 0 at {self.nodes.endpoint} ({str(exc).splitlines()[0]})"
                ) from None
            if launch is None:
                try:
                    self.store.set(f"suite/bye/{self.nodes.node_rank}", "1")
                except dist.DistError:
                    pass  # node 0 already closed: it had our bye or stopped waiting for it
                return
            yield n, launch
            n += 1

    def report(self, n: int, record: dict | None) -> None:
        """What this node got from launch `n`: rank 0's record, or None (rank 0 ran elsewhere, or failed)."""
        self.store.set(f"suite/record/{n}/{self.nodes.node_rank}", json.dumps(record, default=str))


def lead(cell: Cell, timeout: float, coord: Coordinator, sweep_id: str) -> Outcome:
    """Node 0's side of a multi-rank cell across nodes: post the launch, run this node's ranks, and take rank 0's
    record from this node or from the node that got it."""
    nodes, world = coord.nodes, cell.world
    payload, rdzv_id = cell.resolved(), f"{nodes.rdzv_id}-{sweep_id}-{coord.posted}"
    tag = f"{cell.experiment}/{cell.row.name} (launch {coord.posted + 1} of sweep {sweep_id})"
    n = coord.post({"payload": payload, "world": world, "timeout": timeout, "rdzv_id": rdzv_id, "tag": tag})
    started = time.monotonic()
    record, failure = launch(payload, world, timeout, nodes, rdzv_id)
    where = 0
    if record is None and failure["status"] not in ("timeout", "error: interrupted"):
        # Rank 0 ran on another node (or failed): its node reports when its own agent is done.
        got = coord.record(n, timeout - (time.monotonic() - started) + 30)
        if got is not None:
            where, record = got
    if record is None:
        return failure
    return {**record, "rank0_node": where}


def follow(nodes: Nodes, progress=print) -> None:
    """A node other than 0: run this node's ranks of every launch node 0 posts, send back rank 0's record when it
    ran here, and write nothing (node 0 writes the records)."""
    coord = Coordinator.join(nodes)
    progress(
        f"node {nodes.node_rank} of {nodes.nnodes}: following node 0 at {nodes.endpoint} (node 0 writes the records)"
    )
    for n, job in coord.launches():
        progress(f"{job['tag']}: running this node's {nodes.ranks_per_node(job['world'])} rank(s) ...")
        started = time.time()
        record, failure = launch(job["payload"], job["world"], job["timeout"], nodes, job["rdzv_id"])
        coord.report(n, record)
        outcome = "rank 0 ran here, its record sent to node 0" if record else failure["status"].splitlines()[0]
        said = status_of(failure)
        if record is None and said.kind == "error" and said.detail.startswith("cell process exited with code 0"):
            outcome = "done (rank 0 ran on another node)"
        progress(f"{job['tag']}: {outcome} in {time.time() - started:.1f}s")
    progress(f"node {nodes.node_rank}: node 0 ended the sweep")
