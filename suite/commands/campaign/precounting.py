"""Counts made before the GPU: every capped cell of the campaign's stages counted as CUDA runs it, stored for the
GPU's sweeps to take (suite.core.precount)."""

from __future__ import annotations

import os
from pathlib import Path

from suite.commands.campaign import stages
from suite.config import paths
from suite.core.experiment import get_experiment


def precount_stages(which: str, results_dir=None, timeout: float = 1800.0, progress=print) -> int:
    """Count every capped cell of the stages (`all` or one) as the GPU will resolve it (`device=cuda`), on this
    machine's cores, and store each count under results/campaign/precount/ for the GPU's sweeps to take
    (suite.core.precount). Run it where torch and transformers are the GPU image's (`make gpu-precount`: the mimic
    environment) at the commit the GPU will run, with a clean tree. Returns 0 when every count finished."""
    from concurrent.futures import ThreadPoolExecutor

    from suite.core import precount
    from suite.core.launcher import run_cell
    from suite.measure.provenance import versions

    results_dir = Path(results_dir or paths.RESULTS_DIR)
    numbers = stages.stage_numbers(which)
    mine = versions()
    cells = []
    for n in numbers:
        for s in stages.STAGES[n].sweeps:
            exp = get_experiment(s.experiment)
            got = precount.as_on_gpu(exp, list(s.only) if s.only else None)
            cells += [c for c in precount.capped(got) if precount.load(results_dir, c, *mine) is None]
    progress(
        f"precount: {len(cells)} capped cell(s) of stage(s) {which} to count for CUDA (torch {mine[0]}, "
        f"transformers {mine[1]}, each cell's code as its files are now), {os.cpu_count()} at a time"
    )
    failed = 0
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        futures = [(c, pool.submit(run_cell, precount.count_of(c), timeout)) for c in cells]
        for c, future in futures:
            got = future.result()
            precount.save(results_dir, c, got)
            failed += got["status"] not in ("ok", "oom")
            progress(f"precount | {c.experiment}/{c.row.name} | {got['status'].splitlines()[0]}")
    return 1 if failed else 0
