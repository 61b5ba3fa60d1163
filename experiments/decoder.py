"""`make decoder`: which method trains a Llama-style decoder of 1B to 70B parameters on one GPU and its host, counted
on fake tensors on any machine (docs/counting.md), per device and host and by role; measured where a GPU is lent."""

from __future__ import annotations

from suite.config.sizes import parse_size
from suite.core.experiment import Experiment, Metric, Row

SIZES = ("llama-1b", "llama-3b", "llama-8b", "llama-70b")
SEQ = 4096
DEVICES = {"80GB": "80GB", "16GB": "16GB"}  # the H100's and the V100-16GB's device memory
HOSTS = {"128 GiB": "128GiB", "1 TiB": "1TiB"}  # the lent H100's host, and a large server's
# name, method, overrides, label. 16-bit is bf16 (what today's decoders train in); our pipelines and AG keep FP32.
METHODS = (
    ("ag-fp32", "grad_accum", {"precision": "fp32"}, "AG (FP32)"),
    ("amp", "amp", {"precision": "bf16", "recompute": "on"}, "AMP bf16, recompute per layer"),
    ("l2l", "l2l", {"precision": "fp32", "stash": "cpu", "overlap": "on"}, "L2L (FP32), stash on host"),
    ("l2l-cmp", "l2l-cmp", {"precision": "bf16", "stash": "cpu", "overlap": "on"}, "L2L-CMP bf16, stash on host"),
    # The peers recompute per layer as AMP does (as torchtitan's FSDP2 recipes checkpoint each block).
    ("fsdp", "fsdp-offload", {"precision": "bf16", "recompute": "on"}, "peer: torch FSDP2, CPU offload, recompute"),
    ("zero-offload", "deepspeed-offload", {"precision": "bf16", "recompute": "on"}, "peer: ZeRO-Offload, recompute"),
    (
        "zero-infinity",
        "deepspeed-infinity",
        {"precision": "bf16", "recompute": "on"},
        "peer: ZeRO-3 offload, recompute",
    ),
)
PIPELINES = (("gpipe", "gpipe"), ("flush", "pipedream-flush"), ("2bw", "pipedream-2bw"))
DEPTHS = (2, 4, 8)


def rows(profile: str) -> list[Row]:
    out = []
    for device in DEVICES:
        for size in SIZES:
            short = size.removeprefix("llama-")
            common = {"model.preset": size, "device_memory": DEVICES[device]}
            for name, method, overrides, label in METHODS:
                out.append(
                    Row(
                        f"{short}-{name}-{device}",
                        method,
                        {**common, **overrides},
                        {"model": size, "device": device, "method": label, "stages": 1},
                    )
                )
            for name, method in PIPELINES:
                for d in DEPTHS:
                    out.append(
                        Row(
                            f"{short}-{name}-d{d}-{device}",
                            method,
                            {
                                **common,
                                "precision": "fp32",
                                "stages": d,
                                "num_micro_batches": 2 * d,
                                "recompute": True,
                                "executor": "dist",
                            },
                            {
                                "model": size,
                                "device": device,
                                "method": f"{name} (FP32, recompute), per stage",
                                "stages": d,
                            },
                        )
                    )
    return out


def base(profile: str) -> dict:
    return {
        "seq_len": SEQ,
        "micro_batch_size": 1,
        "num_micro_batches": 1,
        "optimizer": "adamw",
        "lr": 1e-4,
        "warmup": 1,
        "steps": 3,
    }


def host_fits(records) -> list[str]:
    """Which rows each host holds: the counted host peak against 128 GiB and 1 TiB."""
    from suite.records.schema import metrics_of

    caps = {k: parse_size(v) for k, v in HOSTS.items()}
    lines = []
    for rec in records:
        host = (metrics_of(rec) or {}).get("host_peak_gb")
        if rec and isinstance(host, (int, float)) and host > 0:
            fits = ", ".join(f"{k}: {'yes' if host * 1e9 <= c else 'no'}" for k, c in caps.items())
            lines.append(f"- `{rec['row']}`: host {host:.1f} GB ({fits})")
    return ["Host memory each counted row needs, against a 128 GiB and a 1 TiB host:", "", *lines, ""] if lines else []


EXPERIMENT = Experiment(
    name="decoder",
    title="Decoders: Llama 3 shapes from 1B to 70B under every method, device and host memory (counted)",
    source="Llama 3.2 1B/3B and Llama 3 8B/70B shapes (docs/model-families.md); no paper table",
    metrics=[
        Metric("memory_gb", "device peak", unit="GB", ratio=False, paper=False),
        Metric("host_peak_gb", "host peak", "{:.1f}", ratio=False, paper=False),
        Metric("throughput", "samples/s", "{:.3g}", ratio=False, paper=False),
    ],
    label_columns=["model", "device", "method", "stages"],
    baseline="1b-ag-fp32-80GB",
    rows=rows,
    base=base,
    detail=lambda cells, records: host_fits(records),
)
