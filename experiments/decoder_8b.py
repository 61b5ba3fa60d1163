"""`make decoder-8b` (issue 54): which method trains Llama 3 8B, and Llama 2 7B's shape, on one 80 GB GPU with its
host, how fast, and exactly. At sequence 4096 and 16 sequences a step (65,536 tokens), bf16 on the device:

- L2L-CMP with the FP32 master and AdamW on the host, its gradients applied as they land (overlap on, no gate:
  14 bytes of host a parameter), the block inputs stashed on the device, with the paper's two block slots and with
  every block resident (a device layer cache: each layer crosses the bus once a step); LAMB beside it;
- FSDP2 with CPU offload (torch's own), recomputing per block as torchtitan's recipes do;
- AMP resident, recomputing per block: counted past the device (the 8B's weights, gradients and AdamW's moments are
  16 bytes a parameter on the device alone);
- at 8 of the 8B's 32 layers, AMP resident and L2L-CMP in the same sweep: what offloading costs where both fit.

Counted on any machine (`--measure count`: device and host peaks by role); timed on a GPU, where each row reports
tokens a second, TFLOPS in the suite's convention (and MFU: the columns every GPU section has) and in 6 x
parameters x tokens a second (suite.measure.flops), and both peaks. At `tiny` the same rows run on llama-tiny
shapes on a CPU."""

from __future__ import annotations

import dataclasses

from suite.config.run import ModelConfig
from suite.core.experiment import Experiment, Metric, Row

SEQ, SEQUENCES = 4096, 16
DEVICE = "80GB"
# The profile's model for each shape: (preset, overrides). Llama 2 7B differs by multi-head attention (32 key-value
# heads), its feed-forward width and its vocabulary; at `tiny` one head a key-value head stands for it.
MODELS = {
    "paper": {"8b": ("llama-8b", {}), "7b": ("llama2-7b", {})},
    "tiny": {"8b": ("llama-tiny", {}), "7b": ("llama-tiny", {"model.kv_heads": 4})},
}
TRUNCATED = {"paper": 8, "tiny": 2}  # layers of the 8B-width model AMP fits on the device
# Every row's model is drawn by Hugging Face's init alone (model.init=hf): the same distributions, and half the
# draws of the host's serial generator that building Llama 3 8B's FP32 weights takes (about 200 s at `full` on a
# 2-core host, 75 at `hf`): each cell builds its model once.
# The stash on the device: at 8B the host is the limit (14 bytes a parameter, 118 GB counted), and 16 sequences
# block inputs (17 GB) would take the host past the lent machine's 126 GiB, while the device has the room.
L2L = {"precision": "bf16", "stash": "gpu", "overlap": "on"}
METHODS = (
    ("l2l-cmp", "l2l-cmp", L2L, "L2L-CMP bf16, AdamW on the host, 2 block slots"),
    ("l2l-cmp-cache", "l2l-cmp", {**L2L, "block_slots": "all"}, "L2L-CMP, every block resident on the device"),
    ("l2l-cmp-lamb", "l2l-cmp", {**L2L, "optimizer": "lamb"}, "L2L-CMP, LAMB on the host"),
    ("fsdp", "fsdp-offload", {"precision": "bf16", "recompute": "on"}, "peer: torch FSDP2, CPU offload, recompute"),
    ("amp", "amp", {"precision": "bf16", "recompute": "on"}, "AMP bf16 resident, recompute per block"),
)


CLIPPED = "L2L-CMP, clipped at 1.0 (norm on the device)"
ON_DEVICE = "L2L-CMP, AdamW on the device (master and moments over the link)"


def _row(profile: str, shape: str, name: str, method: str, overrides: dict, label: str, layers=None) -> Row:
    preset, over = MODELS[profile][shape]
    model = {"model.preset": preset, "model.init": "hf", **over, **({"model.layers": layers} if layers else {})}
    options = dict(overrides)
    if options.get("block_slots") == "all":
        options["block_slots"] = layers or ModelConfig(preset=preset).resolved().layers  # every block
    tag = f"{shape}-{layers}l" if layers else shape
    return Row(
        f"{tag}-{name}",
        method,
        {**model, "device_memory": DEVICE, **options},
        {"model": f"{preset}" + (f", {layers} of its layers" if layers else ""), "method": label},
    )


def rows(profile: str) -> list[Row]:
    profile = "paper" if profile != "tiny" else "tiny"
    out = [_row(profile, shape, *m) for shape in ("8b", "7b") for m in METHODS]
    # Llama recipes clip at 1.0: the norm is taken on the device before anything ships, so the host still applies
    # each gradient as it lands (issue 63, item 4)
    out.append(_row(profile, "8b", "l2l-cmp-clip", "l2l-cmp", {**L2L, "clip_grad_norm": 1.0}, CLIPPED))
    # AdamW on the device, each layer's master and moments over the link (issue 63, item 3)
    out.append(_row(profile, "8b", "l2l-cmp-device", "l2l-cmp", {**L2L, "update": "device"}, ON_DEVICE))
    short = TRUNCATED[profile]
    out += [_row(profile, "8b", *m, layers=short) for m in METHODS if m[0] in ("amp", "l2l-cmp-cache")]
    return out


def base(profile: str) -> dict:
    seq, sequences = (SEQ, SEQUENCES) if profile != "tiny" else (64, 4)
    return {
        "seq_len": seq,
        "micro_batch_size": 1,
        "num_micro_batches": sequences,
        "optimizer": "adamw",
        "lr": 1e-4,
        "warmup": 1,
        "steps": 2,
    }


ROUNDS = 3  # rounds of `steps` timed steps, in the one process that built the model (throughput-rounds)


class OneBuild(Experiment):
    """Each timed cell measures its ROUNDS rounds in the process that built its model, once: Llama 3 8B's FP32 build
    takes minutes of the host's serial generator, and the host holds one copy of it only."""

    def adapt(self, cell, profile):
        if cell.kind != "throughput-rounds":
            return cell
        run = dataclasses.replace(cell.run, options={**cell.run.options, "rounds_inside": ROUNDS})
        return dataclasses.replace(cell, run=run)


EXPERIMENT = OneBuild(
    name="decoder-8b",
    title="Llama 3 8B (and Llama 2 7B's shape) trained on one 80 GB GPU: which method, how fast, with what host",
    source="issue 54; anchors: MegaTrain (2026) 272 TFLOPS for Qwen2.5-7B on one H100 in 6 x N x tokens/s",
    metrics=[
        Metric("tokens_per_s", "tokens/s", "{:.0f}", ratio=False, paper=False),
        Metric("tflops_6n", "TFLOPS (6N)", "{:.0f}", ratio=False, paper=False),
        Metric("throughput", "samples/s", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("memory_gb", "device peak", unit="GB", ratio=False, paper=False),
        Metric("host_peak_gb", "host peak", unit="GB", ratio=False, paper=False),
        Metric("pcie_gb", "PCIe a step (GB)", "{:.3g}", ratio=False, paper=False),
    ],
    label_columns=["model", "method"],
    baseline="8b-8l-amp",
    rows=rows,
    base=base,
    rounds=1,
    kind="throughput-rounds",
    notes=(
        "Each step is 16 sequences of 4096 tokens (micro-batches of one), bf16 on the device under an 80 GB cap. "
        "`TFLOPS` and `MFU` count the model's matmul FLOPs, attention's included (suite.measure.flops); `TFLOPS "
        "(6N)` is 6 x parameters x tokens a second, the convention of offloading papers (MegaTrain's 272 for "
        "Qwen2.5-7B on an H100), which counts the embeddings and not the attention. L2L-CMP keeps 14 bytes of host "
        "a parameter here (FP32 master, AdamW's two moments, the 16-bit copy the device loads; its gradients are "
        "applied as they land; clipped, with the norm taken on the device, where each layer's 16-bit gradient waits "
        "until it is known: 2 bytes a parameter of device, none more of host); FSDP2's offload about 16. Rows past "
        "the device's 80 GB (AMP at full depth) are "
        "counted `oom` and do not run. What offloading costs where AMP fits: the 8-layer rows' tokens a second, "
        "one over the other, read within one sweep (no other row is a ratio to them: other shapes). Each timed "
        "cell builds its model once (Hugging Face's init alone) and measures 3 rounds of 2 steps there after one "
        "warm-up. `PCIe a step`: the bytes L2L's relay copied in a timed step, both ways (its own tally: weights up, "
        "gradients down); the rows' counted traffic and projected step are in decoder-8b-roofline."
    ),
)
