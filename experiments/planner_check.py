"""The 2BW planner's predicted throughput and memory against measured pipeline runs (issue: planner validation)."""

from __future__ import annotations

from suite.core.experiment import Experiment, Metric, Row

# (row, method, stages d, width w, micro-batch b, micro-batches per replica m, recompute)
CONFIGS = [
    ("gpipe-d2-b4", "gpipe", 2, 1, 4, 8, True),
    ("flush-d2-b4", "pipedream-flush", 2, 1, 4, 8, False),
    ("2bw-d2-b4", "pipedream-2bw", 2, 1, 4, 8, False),
    ("2bw-d2-b4-recompute", "pipedream-2bw", 2, 1, 4, 8, True),
    ("flush-d2-b8", "pipedream-flush", 2, 1, 8, 4, False),
    ("2bw-w2-d1-b4", "pipedream-2bw", 1, 2, 4, 4, False),
]
# The paper profile checks the same shapes on GPUs with a BERT-base-sized model.
MODEL = {
    "tiny": {"model.preset": "tiny", "seq_len": 64},
    "small": {"model.preset": "tiny-wide", "seq_len": 128},
    "paper": {"model.preset": "bert-base", "seq_len": 512},
}


def rows(profile: str) -> list[Row]:
    return [
        Row(
            name,
            method,
            {
                "executor": "dist",
                "stages": d,
                "width": w,
                "recompute": rc,
                "micro_batch_size": b,
                "num_micro_batches": m * w,
            },
            {"d": d, "w": w, "b": b, "m": m, "recompute": "on" if rc else "off"},
        )
        for name, method, d, w, b, m, rc in CONFIGS
    ]


def base(profile: str) -> dict:
    return {"optimizer": "lamb", "lr": 1e-4, "warmup": 2, "steps": 10, **MODEL[profile]}


EXPERIMENT = Experiment(
    name="planner-check",
    title="Planner check: predicted against measured throughput and worst-stage memory of pipeline runs",
    source="PipeDream-2BW paper (pipedream-2bw.txt) §4: the planner's cost model, here validated on our own runs",
    metrics=[
        Metric("throughput", "measured samples/s", "{:.1f}", ratio=False, paper=False),
        Metric("predicted_throughput", "predicted samples/s", "{:.1f}", ratio=False, paper=False),
        Metric("throughput_error", "throughput error", "{:+.1%}", ratio=False, paper=False),
        Metric("measured_memory_gb", "measured memory (worst rank)", unit="GB", ratio=False, paper=False),
        Metric("predicted_memory_gb", "predicted memory (worst stage)", unit="GB", ratio=False, paper=False),
        Metric("memory_error", "memory error", "{:+.1%}", ratio=False, paper=False),
    ],
    label_columns=["d", "w", "b", "m", "recompute"],
    baseline="flush-d2-b4",
    rows=rows,
    base=base,
    kind="planned",
    notes=(
        "Each cell runs the method on d x w torchrun ranks (gloo on CPU, NCCL on GPUs), then calibrates the "
        "point-to-point and all-reduce links on those same ranks and predicts the configuration from the "
        "per-layer profile (timed and tracked one layer at a time, cached under results/.cache/profiles). "
        "Error = predicted / measured - 1. Memory on CPU is the live-bytes tracker's worst rank. The paper "
        "gives no planner accuracy figure: there is no paper column."
    ),
)
