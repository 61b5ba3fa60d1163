"""L2L paper Table 6: L2L-CMP on a Turing-NLG-like model, the paper's 17B one or the widest that fits host memory."""

from __future__ import annotations

from experiments.l2l_common import (
    HOST_HEADROOM,
    bert_params,
    fmt_count,
    half,
    l2l_host_bytes,
    l2l_row,
    machine_host_bytes,
    skipped,
)
from suite.core.experiment import Experiment, Metric, Row

# Turing-NLG's shape as the paper states it (78 layers, hidden 4256, sequence 1024, "17 billion");
# 28 heads (of 152) is Turing-NLG's own, which the paper does not restate. The model here is the
# suite's BERT family at that shape (BERT's vocabulary, 4x feed-forward).
LAYERS, HIDDEN, HEAD_DIM, SEQ, VOCAB = 78, 4256, 152, 1024, 30522
PAPER = {"memory_gb": 6.68, "throughput": 0.58}
PAPER_BATCH = 8 * 16  # the paper's uBatch x #uBatches
# What each profile runs: (uBatch, #uBatches, layers run, sequence). At `paper` the full depth and
# batch; below it the depth and sequence shrink so a step takes seconds (tiny: on 2 CPU cores).
RUN_SHAPE = {"paper": (8, 16, LAYERS, SEQ), "small": (8, 4, 8, 256), "tiny": (2, 4, 2, 32)}


def params_at(hidden: int, layers: int = LAYERS) -> int:
    return bert_params(layers, hidden, 4 * hidden, VOCAB, SEQ)


def stash_bytes(hidden: int, layers: int = LAYERS, batch: int = PAPER_BATCH, seq: int = SEQ) -> int:
    """The host stash: one 16-bit block input per layer and sample, kept until the backward."""
    return layers * batch * seq * hidden * 2


def host_need(hidden: int, layers: int = LAYERS, batch: int = PAPER_BATCH, seq: int = SEQ) -> int:
    """Host bytes of L2L-CMP with the stash on the host: the param server plus the stash."""
    return l2l_host_bytes(params_at(hidden, layers)) + stash_bytes(hidden, layers, batch, seq)


def widest_hidden(host_bytes: int) -> int:
    """The widest width (a whole number of Turing-NLG's 152-wide heads) whose L2L-CMP run at the
    paper's depth, batch and sequence fits `host_bytes` x HOST_HEADROOM; 0 if not even one head does."""
    heads = 0
    while host_need(HEAD_DIM * (heads + 1)) <= HOST_HEADROOM * host_bytes:
        heads += 1
    return HEAD_DIM * heads


def base(profile: str) -> dict:
    ub, u, layers, seq = RUN_SHAPE[profile]
    common = {
        "optimizer": "lamb",
        "lr": 1e-4,
        "precision": half(profile),
        "micro_batch_size": ub,
        "num_micro_batches": u,
        "seq_len": seq,
        "model.layers": layers,
        "model.max_seq": SEQ,
        "model.vocab_size": VOCAB,
        "warmup": 1,
        "steps": 2,
    }
    # The paper's V100: on a GPU the rows run under its 16 GB, one layer at a time.
    return {**common, "device_memory": "16GiB"} if profile != "tiny" else common


def rows(profile: str) -> list[Row]:
    ub, u, layers, seq = RUN_SHAPE[profile]
    host = machine_host_bytes()
    out = []
    for name, hidden in (("turing-17b", HIDDEN), ("widest-fit", widest_hidden(host))):
        need = host_need(hidden)
        skip = None
        if hidden == 0:
            skip = f"not even one {HEAD_DIM}-wide head fits {host / 1e9:.1f} GB of host memory at {LAYERS} layers"
        elif need > HOST_HEADROOM * host:
            skip = (
                f"needs {need / 1e9:.0f} GB of host memory; this machine has {host / 1e9:.1f} GB "
                f"({HOST_HEADROOM:.0%} usable)"
            )
        shape = {
            "uBatch": ub,
            "#uBatches": u,
            "device batch": ub * u,
            "seq": seq,
            "#layers": LAYERS if layers == LAYERS else f"{layers} run (of {LAYERS})",
            "hidden": hidden,
            "heads": hidden // HEAD_DIM,
            f"#params at {LAYERS}": fmt_count(params_at(hidden)),
            f"host need at {LAYERS} (GB)": f"{need / 1e9:.0f}",
            "host need run (GB)": f"{host_need(hidden, layers, ub * u, seq) / 1e9:.3g}",
        }
        overrides = {
            "model.hidden": max(hidden, HEAD_DIM),
            "model.heads": max(hidden // HEAD_DIM, 1),
            "model.intermediate": 4 * max(hidden, HEAD_DIM),
        }
        paper = PAPER if name == "turing-17b" else {}
        out.append(
            l2l_row(
                name,
                "l2l-cmp",
                overrides,
                skipped(shape, skip),
                paper,
                options={"stash": "cpu", "overlap": "on"},
                skip=skip,
                count_anyway=hidden > 0,  # only the host's memory stands in the way, which a count does not use
            )
        )
    return out


EXPERIMENT = Experiment(
    name="table6",
    title="Table 6: L2L-CMP on a Turing-NLG-like model (78 layers, 152-wide heads, sequence 1024)",
    source="L2L paper (l2l-constant-memory.txt), section 3.4.2, Table 6: 17B parameters, one 16 GB V100, 512 GB host",
    metrics=[
        Metric("memory_gb", "memory", unit="GB", ratio=False),
        Metric("throughput", "throughput (samples/s)", "{:.3g}", ratio=False),
        Metric("host_peak_gb", "host peak", unit="GB", ratio=False),
    ],
    label_columns=[
        "uBatch",
        "#uBatches",
        "device batch",
        "#layers",
        "hidden",
        "heads",
        "seq",
        f"#params at {LAYERS}",
        f"host need at {LAYERS} (GB)",
        "host need run (GB)",
        "note",
    ],
    baseline="turing-17b",
    rows=rows,
    base=base,
    # Its question is whether the model fits, and its memory (throughput beside it is one round's): one round.
    rounds=1,
    notes=(
        "`host need` is L2L-CMP's host memory with the stash on the host, at 78 layers and the paper's 8 x 16 "
        "samples of 1024 tokens, and at the shape run (to compare with the measured `host peak`, which adds the "
        "process and the model's build): the param server's 16 bytes a parameter in fp16 (FP32 master, two FP32 "
        "LAMB moments, the 16-bit upload copy, and the 16-bit gradient held where it landed until the step's "
        "overflow check has seen every layer) plus the stash, "
        "one 16-bit block input per layer and sample. The paper's 17B model needs about "
        f"{host_need(HIDDEN) / 1e9:.0f} GB ({l2l_host_bytes(params_at(HIDDEN)) / 1e9:.0f} GB param server, "
        f"{stash_bytes(HIDDEN) / 1e9:.0f} GB stash), {host_need(HIDDEN) / 512e9:.0%} of its 512 GB host. "
        f"`widest-fit` is the widest model of whole {HEAD_DIM}-wide heads whose need at 78 layers fits "
        f"{HOST_HEADROOM:.0%} of the memory of the machine that ran the sweep (physical or cgroup limit, "
        "whichever is lower), so its width depends on that machine. At `paper` it runs all 78 layers at "
        "sequence 1024 and the paper's 8 x 16 micro-batches under a 16 GiB device cap (the paper's V100); at "
        "`tiny` it runs 2 of the 78 layers at sequence 32 and 2 x 4 micro-batches on CPU so that a step takes "
        "seconds. By the same accounting the paper's 50B parameters would need about "
        f"{l2l_host_bytes(50 * 10**9) / 1e12:.1f} TB for the param server alone, twice its host. The vocabulary "
        f"is BERT's ({VOCAB}; Turing-NLG's 50257 would add {(50257 - VOCAB) * HIDDEN / 1e6:.0f} M parameters at "
        "4256 wide). Host updates overlap the backward."
    ),
)
