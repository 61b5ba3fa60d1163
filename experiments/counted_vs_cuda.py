"""Counted memory against what it stands for (#12; issue 62, item 5): each of Table 2's rows at a BERT-base shape,
counted on fake tensors and measured in the same cell, their ratio beside; the claim "counted within 5% of CUDA's
allocator" reads its GPU section, so a reader of every counted verdict sees how far counts have been checked.

On a GPU the measured peak is `max_memory_allocated`; on a CPU it is the live-bytes tracker on real tensors (a check
of the count's bookkeeping, not of CUDA: the section's memory kind says which).

The first GPU check (an H200 at c9bdb98, 2026-11-27) ran as a test (tests/test_counting_cuda.py) and kept its figures
only in its JUnit report; `python -m experiments.counted_vs_cuda REPORT.xml COMMIT ENVIRONMENT.json` makes this
experiment's records of it, each figure as the report gives it, with `converted_from` naming the file.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from experiments import table2
from suite.config.paths import repo_named
from suite.core.experiment import Experiment, Metric, Row, get_experiment

SHAPE = {"model.preset": "bert-base", "seq_len": 256, "model.layers": 8, "warmup": 1, "steps": 1}
SHAPES = {  # each row's micro-batches at SHAPE (and its precision where the row's own is the profile's)
    "baseline-fp32": {"micro_batch_size": 4, "num_micro_batches": 2},
    "baseline-amp": {"micro_batch_size": 4, "num_micro_batches": 2, "precision": "fp16"},
    "l2l-fp32": {"micro_batch_size": 8},
    "l2l-cmp": {"micro_batch_size": 8, "stash": "cpu", "precision": "fp16"},
}
BOUND = 0.05  # the count within 5% of the measured peak


def rows(profile: str) -> list[Row]:
    t2 = {r.name: r for r in table2.rows("tiny")}
    return [
        Row(
            name, t2[name].method, {**t2[name].overrides, **SHAPE, **shape}, {"precision": t2[name].labels["precision"]}
        )
        for name, shape in SHAPES.items()
    ]


def figures(counted: float | None, measured: float | None, within: bool | None = None) -> dict:
    """A row's metrics from its two peaks in bytes (either may be unknown where a report kept only its verdict)."""
    ratio = counted / measured if counted and measured else None
    ok = within if ratio is None else abs(ratio - 1) <= BOUND
    return {
        "counted_gb": counted / 1e9 if counted else None,
        "measured_gb": measured / 1e9 if measured else None,
        "counted_over_measured": ratio,
        "gap_mb": (measured - counted) / 1e6 if ratio else None,
        "within_bound": None if ok is None else ("yes" if ok else "no"),
    }


def count_and_measure(run, device, cap) -> dict:
    """The `count-vs-measured` cell kind: the run counted on fake tensors, then measured on `device`; both peaks."""
    from suite.core.cell import count_cell, throughput_cell

    counted = count_cell(run, device, cap)
    measured = throughput_cell(run, device, cap)
    c, m = counted["device_peak_allocated"], measured["device_peak_allocated"]
    return {**figures(c, m), "memory_kind": measured.get("memory_kind")}


EXPERIMENT = Experiment(
    name="counted-vs-cuda",
    title="Counted memory against the measured peak: Table 2's rows at a BERT-base shape (#12)",
    source="this suite's rule: a count stands for the device it counts within 5% (docs/counting.md)",
    metrics=[
        Metric("counted_gb", "counted peak", "{:.4g}", ratio=False, paper=False, unit="GB"),
        Metric("measured_gb", "measured peak", "{:.4g}", ratio=False, paper=False, unit="GB"),
        Metric("counted_over_measured", "counted / measured", "{:.3f}", ratio=False, paper=False),
        Metric("gap_mb", "measured - counted (MB)", "{:+.1f}", ratio=False, paper=False),
        Metric("within_bound", f"within {BOUND:.0%}", "{}", ratio=False, paper=False),
    ],
    label_columns=["precision"],
    baseline="baseline-fp32",
    rows=rows,
    base=lambda profile: table2.base("tiny"),
    kind="count-vs-measured",
    rounds=1,
    notes=(
        "Each cell counts its row on fake tensors and then measures it: on a GPU `max_memory_allocated` over the "
        "warm-up and timed steps, on a CPU the live-bytes tracker on real tensors. The count leaves out the CUDA "
        "context; what else a GPU allocates that the count does not model shows here as a gap that does not grow "
        "with the row's peak. A record converted from a test's report (`converted_from`) keeps what the report "
        "kept: a passing row's verdict without its figures."
    ),
)


def convert(report: Path, commit: str, environment: Path, results_dir: Path) -> list[Path]:
    """This experiment's `paper` records on a GPU from the counted test's JUnit `report` at `commit`, on the machine
    of `environment` (a campaign's environment.json); each failing row's figures as its message gives them."""
    import json

    from suite.records import store

    env = json.loads(environment.read_text())
    fp = env["machine"]
    exp = get_experiment(EXPERIMENT.name)
    suite = ET.parse(report).getroot().find("testsuite")
    finished = suite.get("timestamp")
    written = []
    for case in suite.iter("testcase"):
        row = re.search(r"\[([\w-]+)\]$", case.get("name")).group(1)
        failure = case.find("failure")
        if failure is None:
            metrics = figures(None, None, within=True)
        else:
            _, counted, measured = re.search(r"\('([\w-]+)', (\d+), (\d+)\)", failure.get("message")).groups()
            metrics = figures(float(counted), float(measured))
        metrics["memory_kind"] = "cuda max_memory_allocated"
        (cell,) = exp.cells("paper", [row], ["device=cuda"])
        rec = {
            "status": "ok",
            "metrics": metrics,
            "error": None,
            "provenance": {
                "commit": commit,
                "dirty": False,
                "device": fp["gpu"]["name"],
                "torch": fp["torch"],
                "transformers": fp["transformers"],
                "python": fp["python"],
            },
            "rounds": 1,
            "key": cell.key,
            "experiment": exp.name,
            "row": row,
            "method": cell.row.method,
            "profile": "paper",
            "device_type": "cuda",
            "variant": "",
            "config": cell.resolved(),
            "finished": finished,
            "machine": fp,
            "converted_from": {
                "file": repo_named(report),
                "commit": commit,
                "by": "experiments/counted_vs_cuda.py",
                "finished": "the report's timestamp",
            },
        }
        written.append(store.save(results_dir, cell.key, fp["slug"], rec))
    return written


if __name__ == "__main__":
    from suite.config.paths import RESULTS_DIR

    report, commit, environment = sys.argv[1:4]
    for path in convert(Path(report), commit, Path(environment), Path(RESULTS_DIR)):
        print(path)
