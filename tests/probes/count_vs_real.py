"""Probe for tests/test_counting.py, run in its own process: counted and real figures of one case, as JSON.

Counting runs under FakeTensorMode and weak-reference finalizers on fake storages; a fresh process per probe
keeps that state out of the test process."""

import json
import sys

import torch

from suite.config.run import RunConfig
from suite.core.cell import count_rank
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.measure.counting import count
from suite.measure.memory import LiveBytesTracker


def real(run) -> dict:
    """The CPU measurement's figures: resident bytes plus one tracked step after a warm-up step."""
    torch.manual_seed(0)
    method = build_method(run, torch.device("cpu"))
    batches = synthetic_batches(run, padded=False)
    method.step(next(batches))
    with LiveBytesTracker() as tracker:
        method.step(next(batches))
    out = {"resident": method.resident_device_bytes(), "step_peak": tracker.peak}
    if hasattr(method, "server"):  # L2L's host: the buffers its gradients pass through
        out["host_gradient_bytes"] = sum(t.nbytes for t in method.server.gradient_buffers())
    return out


def counted(run, device: str, round_to: int = 1, limit=None, warmup: int = 1) -> dict:
    build = lambda: build_method(run, torch.device(device))  # noqa: E731
    batches = lambda: synthetic_batches(run, padded=False)  # noqa: E731
    try:
        return count(build, batches, torch.device(device), warmup, round_to, limit)
    except torch.OutOfMemoryError as exc:
        return {"oom": str(exc), **getattr(exc, "metrics", {})}


def main(cases: list[dict]) -> list[dict]:
    out = []
    for case in cases:
        run = RunConfig.from_dict(case["run"]).validate()
        if case.get("world"):  # every rank of a multi-rank run, each in a fake process group
            world, cpu = case["world"], torch.device("cpu")
            out.append({"ranks": [count_rank(run, cpu, None, r, world, case.get("round_to", 1)) for r in range(world)]})
            continue
        where = case.get("device", "cpu")
        got = {"counted": counted(run, where, case.get("round_to", 1), case.get("limit"), case.get("warmup", 1))}
        if case.get("real"):
            got["real"] = real(run)
        out.append(got)
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
