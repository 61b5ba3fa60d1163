"""The largest model whose counted memory fits (the `count-search` cell kind): the planner guesses, counts decide."""

from __future__ import annotations

import dataclasses

import torch

from methods.pipeline.planner.costmodel import DEVICE_SPECS
from methods.pipeline.planner.projection import project
from suite.config.sizes import parse_size
from suite.core.cell import count_cell


def _blocks(run, n: int):
    return dataclasses.replace(run, model=dataclasses.replace(run.model, layers=n))


def params_billion(run) -> float:
    """The parameters of the run's model, from a build on `meta` (sizes only)."""
    from suite.harness.model import param_count

    return param_count(run.model) / 1e9


def search(fits, guess: int, least: int, most: int = 4096) -> int:
    """The largest n in [least, most] with fits(n), fits being monotone (more blocks never hold less); 0 when
    even `least` does not fit. From the guess, steps doubling away from it find a bracket, a bisection closes it:
    two calls when the guess is right."""
    n = min(max(guess, least), most)
    step = 1
    if fits(n):
        lo, hi = n, None
        while hi is None and lo < most:
            nxt = min(lo + step, most)
            lo, hi = (nxt, None) if fits(nxt) else (lo, nxt)
            step *= 2
        if hi is None:
            return most
    else:
        lo, hi = None, n
        while lo is None:
            if hi == least:
                return 0
            nxt = max(hi - step, least)
            lo, hi = (nxt, hi) if fits(nxt) else (None, nxt)
            step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_counted(run, device, cap) -> dict:
    """The most blocks whose counted worst stage fits the cap (--device-memory, else the projection spec's memory),
    each candidate a full count of the method (suite.core.cell.count_cell). The planner's projection under the
    same cap is the first guess; the record keeps every count the search made."""
    spec = run.options.get("projection") or {}
    limit = parse_size(run.device_memory) if run.device_memory else DEVICE_SPECS[spec.get("spec", "v100")].memory
    plain = dataclasses.replace(
        run, device_memory=f"{limit}B", options={k: v for k, v in run.options.items() if k != "projection"}
    )
    from suite.core import registry

    least = max(registry.get(run.method).resolved_options(run)["stages"] - 2, 1)  # a layer for every stage
    guess = project(run, cap=limit)["max_layers"]
    counts: dict[int, dict] = {}

    def fits(n: int) -> bool:
        try:
            counts[n] = count_cell(_blocks(plain, n), device, cap)
            return True
        except torch.OutOfMemoryError as exc:
            counts[n] = {"oom": str(exc).splitlines()[0], **(getattr(exc, "metrics", None) or {})}
            return False

    best = search(fits, guess, least)
    tried = {str(n): c.get("memory_worst_rank_gb", c.get("memory_gb")) or "oom" for n, c in sorted(counts.items())}
    if best == 0:
        err = torch.OutOfMemoryError(f"counted: no model fits {limit} bytes (even {least} blocks are out of memory)")
        err.metrics = {"max_layers": 0, "cap_gb": limit / 1e9, "planner_guess": guess, "searched": tried}
        raise err
    return {
        **counts[best],
        "max_layers": best,
        "max_params_billion": params_billion(_blocks(run, best)),
        "cap_gb": limit / 1e9,
        "planner_guess": guess,
        "searched": tried,  # blocks -> worst stage GB, or "oom"
    }
