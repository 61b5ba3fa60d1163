"""`make l2l-projection`: L2L's step projected on the paper's V100, the H100 of this suite's records, an H200, an A100
and a GH200 (methods/l2l/projection.py), each row held to the figure it can be: the paper's, or a record's."""

from __future__ import annotations

import dataclasses

from experiments import table2, table3
from methods.l2l.projection import DEVICES, outside, project, ran, relay_of
from suite.config import paths
from suite.core.experiment import Metric, ProjectedRow, ProjectingExperiment, Row
from suite.records.index import Index, open_index
from suite.records.schema import machine_of, status_of
from suite.records.trust import suspect

BERT_LARGE = {"model.preset": "bert-large", "seq_len": 512, "optimizer": "lamb", "lr": 1e-4}
# The paper's L2L: Algorithm 2 (the host updates after the backward), micro-batches of 64; its Table 3 keeps the
# stash on the host (its memory, 3.69 GB, is Table 5's stash-on-CPU figure).
PAPER_L2L = {"overlap": "off", "stash": "cpu"}
# Table 2's L2L rows (row, method, stash and overlap) and Table 3's options, as those tables run them.
TABLE2_RELAYS = (
    ("l2l-fp32", "l2l", table2.PAPER_RELAY),
    ("l2l-cmp", "l2l-cmp", table2.PAPER_RELAY),
    *((row, method, options) for row, method, _, options, _ in table2.VARIANTS),
)
TABLE3_L2L = table3.L2L_OPTIONS
# The records each lent GPU's rows are held to, by the slug (or its start) they carry: the H100 80GB SXM of the first
# run (the one H100 this projection was calibrated on), an H200 of whatever memory it reports. A choice of this
# experiment (part of its rows' keys), not a fact of the machine catalogue.
LENT = {"h100": "h100-79gb", "h200": "h200-"}
# The paper's throughputs (samples/s): Table 4's single V100, Tables 2 and 3 over 4.
PAPER_1GPU = {1: 14.57, 2: 18.6, 4: 22.07}
PAPER_4GPU = {("cmp", 1): 52.48, ("cmp", 2): 70.97, ("cmp", 4): 84.91, ("fp32", 1): 22.5}


def _row(name, device, precision, u, options, layers=24, host_optim="fused", gpus=1, reference=None, **labels):
    method = "l2l" if precision == "fp32" else "l2l-cmp"
    return ProjectedRow(
        name,
        method,
        {"precision": precision, "micro_batch_size": 64, "num_micro_batches": u, "model.layers": layers, **options},
        {
            "device": device,
            "GPUs": gpus,
            "precision": "FP32" if precision == "fp32" else "CMP",
            "#uBatches": u,
            "layers": layers,
            "overlap": options["overlap"],
            "stash": options["stash"],
            "host update": host_optim,
            **labels,
        },
        projection={"device": device, "host_optim": host_optim, "gpus": gpus, "reference": reference},
    )


def _record(experiment, row, machine="h100-79gb", harness="first"):
    """A record reference: `machine` a slug's prefix, `harness` the first GPU run's or today's (projection._HARNESS)."""
    return {"source": "record", "machine": machine, "experiment": experiment, "row": row, "harness": harness}


def _paper(value, what):
    return {"source": "paper", "value": value, "what": what}


def rows(profile: str) -> list[Row]:
    out = []
    # The paper's V100: its 1-GPU line (Table 4) chose the V100's fp16 rate and the host's ns/param; its 4-GPU
    # Tables 2 and 3 and its FP32 row are then checked.
    for u in (1, 2, 4):
        out.append(
            _row(
                f"v100-cmp-u{u}-1gpu",
                "v100",
                "fp16",
                u,
                PAPER_L2L,
                host_optim="paper",
                reference=_paper(PAPER_1GPU[u], "L2L paper Table 4, 1 GPU (calibration)"),
            )
        )
        out.append(
            _row(
                f"v100-cmp-u{u}-4gpu",
                "v100",
                "fp16",
                u,
                PAPER_L2L,
                host_optim="paper",
                gpus=4,
                reference=_paper(PAPER_4GPU[("cmp", u)], f"L2L paper Table {2 if u == 1 else 3}, 4 GPUs"),
            )
        )
    out.append(
        _row(
            "v100-fp32-u1-4gpu",
            "v100",
            "fp32",
            1,
            PAPER_L2L,
            host_optim="paper",
            gpus=4,
            reference=_paper(PAPER_4GPU[("fp32", 1)], "L2L paper Table 2, 4 GPUs"),
        )
    )
    # The H100 of the records (h100-79gb, 2026-11-23: the foreach host LAMB, FIFO host thread, overlap as each
    # table had it). Table 3's intercept chose the host's ns/param; Tables 2 and 5 are then checked.
    gated_fifo = {"overlap": "on", "stash": "cpu"}
    out += [
        *(
            _row(
                f"h100-t2-{row}",
                "h100",
                precision,
                1,
                {"overlap": "off", "stash": "gpu"},
                host_optim="foreach",
                reference=_record("table2", row),
            )
            for row, precision in (("l2l-fp32", "fp32"), ("l2l-cmp", "fp16"))
        ),
        *(
            _row(
                f"h100-t3-cmp-u{u}",
                "h100",
                "fp16",
                u,
                gated_fifo,
                host_optim="foreach",
                reference=_record("table3", f"l2l-cmp-u{u}"),
            )
            for u in (1, 2, 4)
        ),
        *(
            _row(
                f"h100-t5-stash-{where}-x{x}",
                "h100",
                "fp16",
                1,
                {"overlap": "on", "stash": where},
                layers=24 * x,
                host_optim="foreach",
                reference=_record("table5", f"stash-{where}-x{x}"),
            )
            for where in ("gpu", "cpu")
            for x in (1, 2, 4)
        ),
    ]
    # Today's relay (fused host LAMB, lowest landed layer first) at Tables 2 and 3's settings on each kind of GPU a
    # campaign is lent, held to that GPU's record of the same row by today's harness once one is committed (the
    # campaign's stages 2 and 3 make them; `make l2l-projection RUN_FLAGS=--force` then holds the rows to them).
    for device in ("h100", "h200"):
        out += [
            _row(
                f"{device}-now-t2-{row}",
                device,
                "fp32" if method == "l2l" else "fp16",
                1,
                options,
                reference=_record("table2", row, LENT[device], "current"),
            )
            for row, method, options in TABLE2_RELAYS
        ]
        out += [
            _row(
                f"{device}-now-t3-cmp-u{u}",
                device,
                "fp16",
                u,
                TABLE3_L2L,
                reference=_record("table3", f"l2l-cmp-u{u}", LENT[device], "current"),
            )
            for u in (1, 2, 4)
        ]
    # Today's relay (fused host LAMB, overlap on, lowest landed layer first) on each GPU: projections only.
    for device in ("h100", "a100", "gh200"):
        for precision in ("fp16", "bf16", "fp32"):
            for u in (1, 2, 4):
                out.append(_row(f"{device}-{precision}-u{u}", device, precision, u, {"overlap": "on", "stash": "cpu"}))
        out.append(_row(f"{device}-fp16-u1-x16", device, "fp16", 1, {"overlap": "on", "stash": "cpu"}, layers=384))
    return out


def base(profile: str) -> dict:
    return dict(BERT_LARGE)


EXPERIMENT = ProjectingExperiment(
    name="l2l-projection",
    title="L2L projected: the relay's step on a V100, an H100, an H200, an A100 and a GH200 (BERT-Large, projected)",
    source="methods/l2l/projection.py; the L2L paper's Tables 2-4 (4x and 1x V100-16GB) and the h100-79gb records",
    metrics=[
        Metric("throughput", "projected (samples/s)", "{:.3g}", ratio=False, paper=False),
        Metric("reference", "reference (samples/s)", "{:.3g}", ratio=False, paper=False),
        Metric("error", "error", "{:+.1%}", ratio=False, paper=False),
        Metric("error_to_spread", "error beyond the record's steps", "{:+.1%}", ratio=False, paper=False),
        Metric("busy_projected", "device busy (projected)", "{:.0%}", ratio=False, paper=False),
        Metric("step_time", "step (s)", "{:.3g}", ratio=False, paper=False),
        Metric("compute_s", "compute (s)", "{:.3g}", ratio=False, paper=False),
        Metric("h2d_s", "uploads (s)", "{:.3g}", ratio=False, paper=False),
        Metric("host_s", "host (s)", "{:.3g}", ratio=False, paper=False),
    ],
    label_columns=["device", "GPUs", "precision", "#uBatches", "layers", "overlap", "stash", "host update"],
    baseline="v100-cmp-u1-1gpu",
    rows=rows,
    base=base,
    rounds=1,
    projected_kind="l2l-projected",
    held_to=lambda run, metrics, index: held_to(run, metrics, index) if "projection" in run.options else {},
    notes=(
        "Projected, nothing measured: each row replays the relay's step (methods/l2l/projection.py) with the "
        "device's stated costs; `error` is the projection against its reference, the paper's figure or the "
        "h100-79gb record's throughput (one or two rounds, the foreach host LAMB); `error beyond the record's "
        "steps` holds it to the throughputs of that record's slowest and fastest timed steps instead (0 inside "
        "them: a record of one round and two to five steps cannot hold a projection closer). The paper's 4-GPU "
        "rows are four relays on one host, which sums the three further GPUs' gradients before each update. "
        "Assumptions, per device: "
        + " ".join(
            f"**{k}**: " + "; ".join(f"{part}: {why}" for part, why in d.sources.items()) + "."
            for k, d in DEVICES.items()
        )
        + " Two of them were read off the figures they are then held to, and those rows are not checks: the V100's "
        "fp16 rate and host ns/param from Table 4's 1-GPU line (2.4 s per micro-batch, 2.0 s per step), the H100 "
        "host's foreach ns/param from Table 3's intercept (0.8 s per step). A third was assumed knowing the gap it "
        "closes: the V100 host's bandwidth for the 4-GPU gradient sum, chosen with the 0.45 s a step the 4-GPU CMP "
        "rows lacked without it, so those rows are a weak check of it; Table 2's FP32 4-GPU row (other bytes, its "
        "own assumed compute rate) is the one that tests it."
    ),
)


def reference(ref: dict, run, index: Index) -> tuple[float | None, str, tuple[float, float] | None]:
    """The figure a projected row is held to, what it is, and for a record the throughputs of its slowest and
    fastest timed steps: a published figure (no spread), or a committed record of a machine (its median over the
    rounds it has)."""
    if ref.get("source") == "paper":
        return ref["value"], ref["what"], None
    rec = index.latest(
        ref["experiment"],
        ref["row"],
        ref["machine"],
        where=lambda rec: (
            isinstance((rec.get("metrics") or {}).get("throughput"), (int, float))
            and _of_harness(rec, ref.get("harness"))
            and ran(rec, run)
        ),
        # A finished record before a partial one, then the latest (where several machines match)
        order=lambda r: (status_of(r).kind == "ok", str(r.get("finished") or "")),
    )
    if rec is None:
        which = f"{ref['experiment']}/{ref['row']}{_HARNESS[ref.get('harness')]}"
        return None, f"no {ref['machine'].rstrip('-')} record of {which}", None
    m = rec["metrics"]
    spread = None
    if all(isinstance(m.get(k), (int, float)) for k in ("step_time_median", "step_time_min", "step_time_max")):
        samples = m["throughput"] * m["step_time_median"]
        spread = (samples / m["step_time_max"], samples / m["step_time_min"])
    what = f"{machine_of(rec)} record {ref['experiment']}/{ref['row']}"
    if why := suspect(rec, index.history(rec)):  # its table flags it: so does every error taken against it
        what += f", suspect ({why})"
    return m["throughput"], what, spread


# Which harness a record reference asks for: "first", the first GPU run's (2026-11-23, before the keyed dropout
# kernel and the fused host LAMB: its records say nothing of their harness), "current", one whose records say
# what they ran with (provenance.harness), or either.
_HARNESS = {None: "", "first": " by the first harness", "current": " by today's harness"}


def _of_harness(rec: dict, which: str | None) -> bool:
    said = "harness" in (rec.get("provenance") or {})
    return which is None or (which == "current") == said


def projected_cell(run, device, cap) -> dict:
    """The `l2l-projected` cell kind: the run's step replayed on run.options["projection"]["device"] (a DEVICES
    name) with its host optimizer, times its GPUs (the paper's 4-GPU rows: its Table 4 shows near-linear scaling).
    What it is held to is read when the table is rendered (held_to), against the records of that day."""
    p = run.options["projection"]
    # the link a lent GPU of the kind measured, where one has (the index's machine: its bench-link record), else the
    # catalogue's assumed rate the device was defined with
    link = open_index(paths.RESULTS_DIR).machine(p["device"]).rates
    spec = dataclasses.replace(
        DEVICES[p["device"]],
        h2d_gbps=link["h2d_gbps"].value,
        d2h_gbps=link["d2h_gbps"].value,
        sources={**DEVICES[p["device"]].sources, "link": link["h2d_gbps"].source},
    )
    gpus = p.get("gpus", 1)
    out = project(relay_of(run, spec, p.get("host_optim", "fused"), gpus))
    return {
        "throughput": gpus * out.throughput,
        "step_time": out.step_s,
        "busy_projected": out.busy,
        "bound": out.bound,
        "compute_s": out.compute_s,
        "h2d_s": out.h2d_s,
        "d2h_s": out.d2h_s,
        "host_s": out.host_s,
        "device_spec": spec.name,
        "assumptions": spec.sources,
    }


def held_to(run, metrics: dict, index: Index) -> dict:
    """A projected row's reference (a published figure, or the latest record of the machine's row that ran the
    projected run), read from the records as the table is rendered, and the projection's error against it."""
    p = run.options.get("projection") or {}
    ref, what, spread = (
        reference(p["reference"], run, index) if p.get("reference") else (None, "none: a projection only", None)
    )
    throughput = metrics.get("throughput")
    return {
        "reference": ref,
        "reference_of": what,
        "error": (throughput - ref) / ref if ref and throughput else None,
        # A record's steps spread: the projection against the nearest end of the throughputs its fastest and slowest
        # timed steps give (0 inside), since no projection can be held closer than the measurement holds itself.
        "reference_range": list(spread) if spread else None,
        "error_to_spread": outside(throughput, spread) if spread and throughput else None,
    }
