"""The PipeDream-2BW paper's claims (Table 1, Figures 6-9, the planner), read from `tiny` runs and the counts."""

from __future__ import annotations

from experiments.claims.common import CPU, TINY_CPU, num, nums
from suite.report import verdicts
from suite.report.claims import SEE, Claim, Finding
from suite.report.reading import Reading, Where

RATE = "samples/s ours"


def accuracy(r: Reading) -> Finding:
    loss = nums([r.value(x, "val loss ours") for x in ("bert-vanilla", "bert-2bw")], ".3f")
    ppl = nums([r.value(x, "val perplexity ours") for x in ("gpt2-vanilla", "gpt2-2bw")], ".1f")
    return Finding(f"BERT-MLM validation loss {loss}; GPT-2 perplexity {ppl} (vanilla, 2BW)", SEE)


def low_batch(r: Reading) -> Finding:
    at = {
        m: nums([r.value(f"measured-{s}-m{m}", RATE) for s in ("pipedream-2bw", "pipedream-flush", "gpipe")], ".0f")
        for m in (2, 16)
    }
    return Finding(f"d = 2, 2BW, Flush, GPipe: {at[2]} samples/s at 2 micro-batches, {at[16]} at 16", SEE)


def memory_order(r: Reading) -> Finding:
    col = "memory (worst rank/stage) ours (GB)"
    names = {"GPipe": "gpipe", "2BW": "pipedream-2bw", "Flush": "pipedream-flush"}
    values = {k: r.value(f"projected-{v}-B64-rc1", col) for k, v in names.items()}
    ours = "GPT-2.2B, d = 8, batch 64, recompute: " + ", ".join(f"{k} {num(x, '.2f')} GB" for k, x in values.items())
    return Finding(ours, verdicts.order(values, ["GPipe", "2BW", "Flush"]))


def batch(r: Reading) -> Finding:
    at = {b: nums([r.value(f"measured-d2-b{b}-B{n}", RATE) for n in (16, 32, 64)], ".0f") for b in (8, 2)}
    return Finding(f"d = 2: b = 8 gives {at[8]} samples/s at batch 16, 32, 64; b = 2 gives {at[2]}", SEE)


def deeper_fits(r: Reading) -> Finding:
    sizes = [r.value(f"projected-d{d}", "largest model (B params) ours") for d in (1, 2, 4, 8, 16, 32, 64)]
    ours = f"hidden 4096: {num(sizes[0], '.2f')}B at d = 1 to {num(sizes[-1], '.1f')}B at d = 64"
    return Finding(ours, verdicts.grows(sizes, 30.0))


def planner(r: Reading) -> Finding:
    mem = [r.value(x, "memory error") for x in r.rows]
    rate = [r.value(x, "throughput error") for x in r.rows]
    span = [f"{min(xs):+.1%}..{max(xs):+.1%}" if None not in xs else "—" for xs in (mem, rate)]
    held = verdicts.within(mem, 0.10) and verdicts.within_factor(rate, 2.0)
    verdict = "within its test's bounds (10% memory, 2x throughput)" if held else "outside its test's bounds"
    return Finding(f"{len(r.rows)} runs: memory {span[0]}, throughput {span[1]}", verdict)


CLAIMS = [
    Claim(
        "2BW's accuracy is close to vanilla's",
        "2BW Table 1",
        "MNLI 87.77 vs 87.82; GPT perplexity 19.28 vs 19.56",
        Where("2bw-table1", "tiny", TINY_CPU),
        accuracy,
    ),
    Claim(
        "2BW is faster than Flush, and Flush than GPipe, at low batch",
        "2BW Figure 6",
        "2BW up to 1.6x Flush, 3.2x GPipe",
        Where("2bw-fig6", "tiny", TINY_CPU),
        low_batch,
    ),
    Claim(
        "Stage memory: GPipe > 2BW > Flush",
        "2BW Figure 7",
        "GPipe OOM at batch 64; 2BW below GPipe, above Flush",
        Where("2bw-fig7", "paper", CPU, counted=True),
        memory_order,
    ),
    Claim(
        "Throughput rises with batch",
        "2BW Figure 8",
        "rises with batch; at d = 8 a larger b wins",
        Where("2bw-fig8", "tiny", TINY_CPU),
        batch,
    ),
    Claim(
        "Deeper pipelines fit larger models",
        "2BW Figure 9",
        "almost 30B at d = 64",
        Where("2bw-fig9", "paper", CPU, counted=True),
        deeper_fits,
    ),
    Claim(
        "The planner's cost model predicts measured runs",
        "2BW §4",
        "no error figure given",
        Where("planner-check", "tiny", TINY_CPU),
        planner,
    ),
]
