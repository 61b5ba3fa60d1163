"""A training step's FLOPs and the device's dense peak: the achieved TFLOPS and MFU of a CUDA throughput record.

The formula, stated once (matmul FLOPs only, as in Narayanan et al. 2021, eq. 3; a multiply-add is 2 FLOPs).
For L blocks of hidden size H and feed-forward size I over a sequence of S tokens, the forward of one block is

    8 S H^2  (the Q, K, V and output projections)  +  4 S H I  (the two feed-forward matmuls)
    + 4 S^2 H  (Q K^T and the probabilities times V, over all heads)

A Llama block's grouped-query attention projects keys and values to K = kv_heads x head size (4 S H^2 + 4 S H K in
place of 8 S H^2), and its SwiGLU feed-forward has three matmuls (6 S H I); the attention term counts every query
against every key, as for the other models (a causal kernel that skips the masked half does less).

and the head adds 2 H^2 + 2 H C per sequence (pooler and classifier: `classify`), 2 S H V for the vocabulary
projection of a language model (`clm`), or 2 S H^2 + 2 S H V (`mlm`: BERT's transform, then the vocabulary).
Training is three forwards' worth (the backward multiplies twice per forward matmul): the model FLOPs MFU is
taken against. A recompute runs every block's forward once more: hardware FLOPs, counted apart (HFU), never in MFU.

Beside it, the convention of offloading papers such as MegaTrain (2026): 6 x parameters x tokens a second
(`tflops_6n`), every parameter counted (the embeddings' too), the attention's S^2 terms and any recompute not.
"""

from __future__ import annotations

from suite.measure import machines


def block_flops(seq: int, hidden: int, intermediate: int, kv: int | None = None, ffn_matmuls: int = 2) -> float:
    """Forward FLOPs of one transformer block over one sequence (kv: the key-value width under grouped queries)."""
    kv = hidden if kv is None else kv
    return 4 * seq * hidden * (hidden + kv) + 2 * ffn_matmuls * seq * hidden * intermediate + 4 * seq**2 * hidden


def head_flops(objective: str, seq: int, hidden: int, vocab: int, labels: int) -> float:
    """Forward FLOPs of the head over one sequence."""
    if objective == "classify":
        return 2 * hidden**2 + 2 * hidden * labels
    if objective == "clm":
        return 2 * seq * hidden * vocab
    return 2 * seq * hidden**2 + 2 * seq * hidden * vocab  # mlm


def per_sample(run, recompute: bool | None = None) -> dict[str, float]:
    """Model and hardware FLOPs of training on one sample of `run` (a RunConfig); `recompute`: whether its method
    runs every block's forward twice (Method.recomputes; None: the run's `recompute` option says)."""
    from suite.harness.families import FAMILIES

    m = run.model.resolved()
    family = FAMILIES[m.family]
    kv = m.kv_heads * (m.hidden // m.heads) if m.kv_heads else None
    block = block_flops(run.seq_len, m.hidden, m.intermediate, kv, getattr(family, "ffn_matmuls", 2))
    forward = m.layers * block + head_flops(family.objective, run.seq_len, m.hidden, m.vocab_size, m.num_labels)
    if recompute is None:
        recompute = str(run.options.get("recompute", "off")).lower() in ("on", "true")
    return {
        "flops_per_sample": 3 * forward,
        "hardware_flops_per_sample": 3 * forward + (m.layers * block if recompute else 0),
    }


def peak_tflops(device_name: str, precision: str, tf32: bool = False) -> float | None:
    """The dense peak of `device_name` at a run's precision (FP32 as TF32 where torch allows it); None if unknown."""
    found = machines.of_device(device_name)
    return found.peaks.get("tf32" if precision == "fp32" and tf32 else precision) if found else None


def parameters(run) -> int:
    """Every parameter of `run`'s model, counted on the meta device (no memory, seconds at 70B)."""
    import torch

    from suite.harness.model import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(run.model, run.seed).parameters())


def achieved(metrics: dict) -> dict:
    """TFLOPS and utilisation from a record's (merged) throughput and the FLOPs and peak the cell stored; tokens a
    second and 6 x parameters x tokens a second where it stored the parameters and tokens a sample."""
    rate, flops = metrics.get("throughput"), metrics.get("flops_per_sample")
    if not isinstance(rate, (int, float)) or not flops:
        return {}
    out = {"model_tflops": rate * flops / 1e12, "hardware_tflops": rate * metrics["hardware_flops_per_sample"] / 1e12}
    if metrics.get("parameters") and metrics.get("tokens_per_sample"):
        out["tokens_per_s"] = rate * metrics["tokens_per_sample"]
        out["tflops_6n"] = 6 * metrics["parameters"] * out["tokens_per_s"] / 1e12
    peak = metrics.get("peak_tflops")
    if peak:
        out["mfu"] = out["model_tflops"] / peak
        out["hfu"] = out["hardware_tflops"] / peak
    return out


def cuda_metrics(run, device, metrics: dict, devices: int = 1, recompute: bool | None = None) -> dict:
    """What a CUDA throughput cell adds to its metrics: FLOPs per sample (`recompute`: per_sample's), the peak it is
    measured against (that of all `devices` the step ran on), and the achieved TFLOPS, MFU and HFU."""
    import torch

    name = torch.cuda.get_device_name(device)
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    peak = peak_tflops(name, run.precision, tf32)
    out = {
        **per_sample(run, recompute),
        "parameters": parameters(run),
        "tokens_per_sample": run.seq_len,
        "peak_tflops": peak * devices if peak else None,
        "peak_of": f"{devices} x {name}, {'tf32' if run.precision == 'fp32' and tf32 else run.precision} dense"
        + ("" if peak else ": not in the machine catalogue (suite/measure/machines.py), no MFU"),
    }
    return {**out, **achieved({**metrics, **out})}
