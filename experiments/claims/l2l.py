"""The L2L paper's claims (Tables 2-7), read from the H100's records, the counts and Table 7 at `small`."""

from __future__ import annotations

from experiments import table7_equivalence
from experiments.claims.common import CPU, H100, TINY_CPU, figure_or_status, num, nums
from suite.report import verdicts
from suite.report.claims import Claim, Finding
from suite.report.reading import Reading, Where

MEMORY = "memory ours (GB)"
RATE = "throughput (samples/s) ours"
DEPTHS = ("x1", "x2", "x4", "x16")  # Table 5's rows at 24, 48, 96 and 384 layers
TASKS = {"qnli": "QNLI", "sst2": "SST-2", "cola": "CoLA", "stsb": "STS-B", "mrpc": "MRPC", "rte": "RTE"}


def flat_in_depth(spec: str):
    """Table 5's L2L-CMP with the stash on the host, at every depth."""

    def judge(r: Reading) -> Finding:
        rows = [f"stash-cpu-{d}" for d in DEPTHS]
        values = [r.value(row, MEMORY) for row in rows]
        layers = [str(r.rows[row]["#layers"]) for row in rows]
        shown = [(v, n) for v, n in zip(values, layers) if v is not None]
        ours = f"{', '.join(format(v, spec) for v, _ in shown)} GB at {', '.join(n for _, n in shown)} layers"
        ours += "".join(f"; {n} layers: `{r.status(row)}`" for row, v, n in zip(rows, values, layers) if v is None)
        return Finding(ours, verdicts.flat(values, [f"{n} layers" for n in layers]))

    return judge


def out_at_48(prefix: str):
    """Table 5's baseline rows (`baseline`: AMP; `fp32-baseline`) at 24, 48 and 96 layers."""

    def judge(r: Reading) -> Finding:
        gb = r.value(f"{prefix}-x2", MEMORY)
        at = [figure_or_status(r, f"{prefix}-{d}", MEMORY, ".2f", " GB") for d in DEPTHS[:3]]
        gib = f" ({gb * verdicts.GB / verdicts.GIB:.2f} GiB)" if gb is not None else ""
        ours = f"{at[0]} at 24 layers, {at[1]}{gib} at 48, {at[2]} at 96"
        return Finding(ours, verdicts.out_of_memory(r.status(f"{prefix}-x2"), gb))

    return judge


def inner_loop(r: Reading) -> Finding:
    rows = ["l2l-cmp-u1", "l2l-cmp-u2", "l2l-cmp-u4"]
    gains = [r.value(x, "throughput xl2l-cmp-u1 ours") for x in rows[1:]]
    ours = f"{nums([r.value(x, RATE) for x in rows], '.1f')} samples/s at 1, 2, 4 micro-batches"
    return Finding(f"{ours} ({nums(gains, '.2f', 'x')})", verdicts.gain(gains, [1.35, 1.62]))


def cmp_against_recompute(r: Reading) -> Finding:
    ratios = [r.ratio(f"l2l-cmp-u{u}", f"amp-rc-u{u}", RATE) for u in (1, 2, 4)]
    ours = f"{nums(ratios, '.2f', 'x')} of AMP recomputing per layer at 1, 2, 4 micro-batches"
    return Finding(ours, verdicts.target(ratios, ["1", "2", "4"], 0.95))


def cmp_faster(r: Reading) -> Finding:
    cmp, amp = (r.value(x, "throughput xbaseline-fp32 ours") for x in ("l2l-cmp", "baseline-amp"))
    rates = nums([r.value(x, RATE) for x in ("l2l-cmp", "baseline-amp", "baseline-fp32")], ".1f")
    ours = f"CMP {num(cmp, '.2f')}x, AMP {num(amp, '.2f')}x of FP32 AG ({rates} samples/s)"
    return Finding(ours, verdicts.faster(cmp, amp))


def cmp_less_memory(r: Reading) -> Finding:
    cmp, amp = r.value("l2l-cmp", MEMORY), r.value("baseline-amp", MEMORY)
    ours = f"CMP {num(cmp, '.2f')} GB at device batch 64, AMP {num(amp, '.2f')} GB at 2"
    return Finding(ours, verdicts.less(cmp, amp))


def scaling(r: Reading) -> Finding:
    gains = [r.value(f"N-ranks-u{u}", "throughput x1-rank-u1 ours") for u in (1, 2, 4)]
    ours = (
        f"{r.rows['N-ranks-u1']['#ranks']} gloo ranks: {nums(gains, '.2f', 'x')} of one rank at 1, 2, 4 micro-batches"
    )
    return Finding(ours, "untested: needs 2 or more GPUs")


def turing_17b(r: Reading) -> Finding:
    """The counted device and host peaks (the table's `host need` columns are the formula's, not the count)."""
    dev, host = r.value("turing-17b", MEMORY), r.value("turing-17b", "host peak ours (GB)")
    fits = dev is not None and dev * verdicts.GB <= 16 * verdicts.GIB
    verdict = "fits the device (counted, not run)" if fits else "does not fit the device (counted)"
    return Finding(f"{num(dev, '.2f')} GB on the device, {num(host, '.0f')} GB on the host, both counted", verdict)


def table7(kind: str):
    """`fp32`: L2L FP32 against the same-seed baseline; `cmp`: L2L-CMP against AMP. The rule is
    table7_equivalence.verdict's: within the seed-to-seed spread of the FP32 baseline (max - min over 3 seeds)."""

    def judge(r: Reading) -> Finding:
        parts, done = [], 0
        for task, name in TASKS.items():
            v = table7_equivalence.verdict(r.records_read("score"), task)
            # The same-seed baseline is the first seed row, known only when every seed row is (else: pending)
            same_seed = v["seeds"][0] if len(v["seeds"]) == len(table7_equivalence.SEED_ROWS) else None
            ours, ref = (v["fp32"], same_seed) if kind == "fp32" else (v["cmp"], v["amp"])
            parts.append(f"{name} {num(ours, '.1f')}/{num(ref, '.1f')} (spread {num(v['spread'], '.1f')})")
            done += v[f"{kind}_verdict"] == "reproduced"
        word = "reproduced" if done == len(TASKS) else "partly reproduced" if done else "not reproduced"
        return Finding(", ".join(parts), f"{word} ({done} of {len(TASKS)} tasks)")

    return judge


T2, T2_COUNT = Where("table2", "paper", H100), Where("table2", "paper", CPU, counted=True)
T3 = Where("table3", "paper", H100)
T5, T5_COUNT = Where("table5", "paper", H100), Where("table5", "paper", CPU, counted=True)
T7 = Where("table7", "small", CPU)
FLAT, OOM48 = "L2L: device memory flat in depth, stash on the host", "The AMP baseline runs out of 16 GB at 48 layers"
CMP_MEMORY, EQUAL = "L2L-CMP needs less device memory than AMP", "table7_equivalence.md"

CLAIMS = [
    Claim(FLAT, "L2L Table 5", "3.69 GB at 24 to 384 layers", T5, flat_in_depth(".2f")),
    Claim(FLAT, "L2L Table 5", "3.69 GB at 24 to 384 layers", T5_COUNT, flat_in_depth(".3f")),
    Claim(OOM48, "L2L Table 5", "9.23 GB at 24 layers, OOM at 48", T5, out_at_48("baseline")),
    Claim(OOM48, "L2L Table 5", "9.23 GB at 24 layers, OOM at 48", T5_COUNT, out_at_48("baseline")),
    Claim(
        "The FP32 baseline runs out of 16 GB at 48 layers",
        "L2L §3.4.1",
        "OOM at 48 (text)",
        T5_COUNT,
        out_at_48("fp32-baseline"),
    ),
    Claim("Inner looping raises throughput", "L2L Table 3", "1.35x at 2, 1.62x at 4 micro-batches", T3, inner_loop),
    Claim(
        "L2L-CMP at 95% of AMP recomputing per layer, same batch",
        "this suite's target",
        "not in the paper",
        T3,
        cmp_against_recompute,
    ),
    Claim("L2L-CMP is faster than AMP", "L2L Table 2", "CMP 3.18x, AMP 1.59x of FP32 AG", T2, cmp_faster),
    Claim(CMP_MEMORY, "L2L Table 2", "CMP 4.96 GB, AMP 9.2 GB", T2_COUNT, cmp_less_memory),
    Claim(CMP_MEMORY, "L2L Table 2", "CMP 4.96 GB, AMP 9.2 GB", T2, cmp_less_memory),
    Claim(
        "Near-linear scaling over devices", "L2L Table 4", "3.60x on 4 GPUs", Where("table4", "tiny", TINY_CPU), scaling
    ),
    Claim(
        "The 17B Turing-NLG-like model trains on one 16 GB V100",
        "L2L Table 6",
        "6.68 GB device, 512 GB host",
        Where("table6", "paper", CPU, counted=True),
        turing_17b,
    ),
    Claim(
        "L2L FP32 ends as the baseline does: within the seed spread (GLUE dev, L2L/baseline)",
        "L2L Table 7",
        "'almost mathematically equivalent'; e.g. MRPC 88.30/88.58",
        T7,
        table7("fp32"),
        EQUAL,
    ),
    Claim(
        "L2L-CMP ends as AMP does: within the seed spread (GLUE dev, CMP/AMP)",
        "L2L Table 7",
        "e.g. MRPC 88.50/87.97",
        T7,
        table7("cmp"),
        EQUAL,
    ),
]
