"""A lent machine's host-update micro-benchmarks (results/campaign/<machine>/bench.json, pytest-benchmark's file of
tests/l2l/test_l2l_bench.py from a campaign's stage 1) as a bench-host-optim record of that machine, every sample
unchanged: the suite's fused AdamW and LAMB as L2L's param server steps one BERT-base encoder layer, and torch's fused
AdamW on the same layer's FP32 gradients, at the machine's torch threads. The record says what differs from the
experiment's own cell: one round of each, timed one after another (not interleaved), no triad, no DeepSpeed.

    python -m experiments.benchmarks.campaign_bench results/campaign/h200-140gb/bench.json \\
        results/campaign/h200-140gb/environment.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.benchmarks import host_optim
from suite.config.paths import repo_named
from suite.core.experiment import get_experiment

# pytest-benchmark's test names and the candidates they time
NAMES = {
    "test_host_update_per_parameter[lamb]": "suite LAMB, fused (L2L's host)",
    "test_host_update_per_parameter[adamw]": "suite AdamW, fused (L2L's host)",
    "test_torch_fused_cpu_adamw_per_parameter": "torch AdamW, fused",
}
KINDS = {
    "suite LAMB, fused (L2L's host)": "lamb",
    "suite AdamW, fused (L2L's host)": "adamw",
    "torch AdamW, fused": "adamw",
}


def convert(bench: Path, environment: Path, results_dir: Path) -> Path:
    """The record, saved under the machine of `environment` (a campaign's environment.json)."""
    from suite.records import store

    data, env = json.loads(bench.read_text()), json.loads(environment.read_text())
    fp = env["machine"]
    timed = {NAMES[b["name"]]: b for b in data["benchmarks"] if b["name"] in NAMES}
    (numel,) = {b["extra_info"]["parameters"] for b in timed.values()}
    m = {
        "numel": numel,
        "rounds": 1,
        "threads": fp["cpu"]["torch_threads"],
        "times": {name: list(b["stats"]["data"]) for name, b in timed.items()},
        "fixed": {},
        "kinds": {name: KINDS[name] for name in timed},
    }
    exp = get_experiment(host_optim.EXPERIMENT.name)
    (cell,) = exp.cells("small", ["layer-all-threads"], ["device=cpu"])
    commit = data["commit_info"]["id"]
    rec = {
        "status": "ok",
        # whether the fused LAMB was built there the file does not say
        "metrics": host_optim.cell_metrics(host_optim.summarise(m), m, "layer", None, None),
        "error": None,
        "provenance": {
            "commit": commit,
            "dirty": bool(data["commit_info"].get("dirty")),
            "device": "cpu",
            "torch": fp["torch"],
            "transformers": fp["transformers"],
            "python": fp["python"],
            "threads": fp["cpu"]["torch_threads"],
        },
        "rounds": 1,
        "key": cell.key,
        "experiment": exp.name,
        "row": cell.row.name,
        "method": cell.row.method,
        "profile": "small",
        "device_type": "cpu",
        "variant": "",
        "config": cell.resolved(),
        "finished": data["datetime"],
        "machine": fp,
        "converted_from": {
            "file": repo_named(bench),
            "commit": commit,
            "by": "experiments/benchmarks/campaign_bench.py",
            "finished": "the file's datetime",
            "differs": "pytest-benchmark's calls of each candidate one after another (one round, not interleaved; "
            "no warm-up step), no triad, no DeepSpeed; the layer as tests/l2l/test_l2l_bench.py builds it",
        },
    }
    return store.save(results_dir, cell.key, fp["slug"], rec)


if __name__ == "__main__":
    from suite.config.paths import RESULTS_DIR

    print(convert(Path(sys.argv[1]), Path(sys.argv[2]), Path(RESULTS_DIR)))
