"""Shared by the L2L Tables 3-6: rows carrying method options or a skip reason, and BERT size arithmetic."""

from __future__ import annotations

import os
from typing import Any

from suite.core.experiment import Row

# Host bytes per parameter of the eager param server (methods/l2l/param_server.py): the FP32 master and two FP32
# optimizer moments (LAMB and AdamW alike); under CMP the 16-bit copy uploaded to the device. Where the host may
# commit a layer only once every gradient is in (fp16's overflow gate, clipping's norm, overlap=off), each layer's
# gradient is held where it landed, in the wire's dtype (CMP's 16-bit, FP32's the optimizer reads); applied as they
# land (overlap=on, no gate), the gradients pass through a ring bounded by the largest layer, not by the model.
HOST_BYTES_PER_PARAM = {"l2l": 4 + 8, "l2l-cmp": 4 + 8 + 2}
HELD_GRADIENT_BYTES = {"l2l": 4, "l2l-cmp": 2}
HOST_HEADROOM = 0.8  # of the machine's memory: the OS, Python and torch, the device-side slots on a CPU run


# The model and sequence of each profile: Table 1's BERT-Large at `paper`, BERT-base at `small`.
PROFILE_MODEL = {
    "paper": {"model.preset": "bert-large", "seq_len": 512},
    "small": {"model.preset": "bert-base", "seq_len": 128},
    "tiny": {"model.preset": "tiny", "seq_len": 64},
}


# The paper's device: a 16 GB V100, emulated at `paper` on a bigger GPU by capping the CUDA caching allocator.
PAPER_DEVICE_MEMORY = "16GiB"


# Warm-up and timed steps per round. `paper` runs on a GPU, in a lent window: its step times vary little within a
# round (the H100's records: within 1% for AMP, 10-20% for L2L-CMP, whose host side varies), and the spread that the
# tables show is across the three rounds, so three timed steps a round (and one warm-up, the worker's kernels being
# warm) buy the same median for little more than half the device time of two and five.
STEPS = {"paper": (1, 3), "small": (2, 5), "tiny": (2, 5)}


def bert_base(profile: str, warmup: int | None = None, steps: int | None = None, **extra) -> dict:
    """The overrides every L2L table starts from at `profile`: model, sequence, LAMB, timed steps (and the
    paper's 16 GB device at `paper`)."""
    cap = {"device_memory": PAPER_DEVICE_MEMORY} if profile == "paper" else {}
    warmup = STEPS[profile][0] if warmup is None else warmup
    steps = STEPS[profile][1] if steps is None else steps
    return {"optimizer": "lamb", "lr": 1e-4, **PROFILE_MODEL[profile], "warmup": warmup, "steps": steps, **cap, **extra}


def half(profile: str) -> str:
    """16-bit precision of the AMP and CMP rows: fp16 on a GPU profile, bf16 (CPU autocast) at `tiny`."""
    return "bf16" if profile == "tiny" else "fp16"


def l2l_row(
    name: str,
    method: str,
    overrides: dict,
    labels: dict,
    paper: dict | None = None,
    options: dict | None = None,
    skip: str | None = None,
    count_anyway: bool = False,
) -> Row:
    """A Row whose method options (L2L's stash, overlap) join its overrides."""
    return Row(name, method, {**overrides, **(options or {})}, labels, paper or {}, skip, count_anyway)


def placed(options: dict) -> dict:
    """A relay's options as a table's labels say them: the stash's place as `device` or `host` (the option's `gpu`
    and `cpu`), which reads true on a CPU machine too."""
    where = {"gpu": "device", "cpu": "host"}
    return {k: where.get(v, v) if k == "stash" else v for k, v in options.items()}


def bert_params(
    layers: int, hidden: int, intermediate: int, vocab_size: int, max_seq: int, num_labels: int = 2, type_vocab: int = 2
) -> int:
    """Parameters of BertForSequenceClassification (checked against a built model in the tests)."""
    embed = (vocab_size + max_seq + type_vocab) * hidden + 2 * hidden  # three tables + LayerNorm
    block = (
        4 * (hidden * hidden + hidden)  # Q, K, V, attention output
        + 2 * hidden * intermediate
        + intermediate
        + hidden  # feed-forward in and out
        + 2 * 2 * hidden
    )  # two LayerNorms
    head = hidden * hidden + hidden + hidden * num_labels + num_labels  # pooler + classifier
    return embed + layers * block + head


def l2l_host_bytes(params: int, method: str = "l2l-cmp", held: bool = True) -> int:
    """Host memory the eager param server holds for a model of `params` parameters, its gradients `held` until a
    gate opens (fp16, clipping or overlap=off) or applied as they land (the ring's few layers not included)."""
    return params * (HOST_BYTES_PER_PARAM[method] + (HELD_GRADIENT_BYTES[method] if held else 0))


def machine_host_bytes() -> int:
    """Physical memory, or the cgroup's limit when that is lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path).read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def fmt_count(n: int) -> str:
    """1_234_000_000 -> '1.23 B'; the paper writes '300 MILLION', '17 BILLION'."""
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def skipped(labels: dict[str, Any], reason: str | None) -> dict[str, Any]:
    """A row's labels with its `note` saying why it has no cell (its status reads `skipped: ...`)."""
    return {**labels, "note": f"not run: {reason}" if reason else labels.get("note", "")}
