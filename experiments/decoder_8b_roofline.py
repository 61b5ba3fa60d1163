"""`make decoder-8b` projects its rows too: each decoder-8b row that fits (AMP at full depth is counted past the
device) on an H100 and an H200 with their hosts, a roofline per row (methods/roofline.py): what the step computes,
moves over PCIe and streams through host memory, the limit named, held to that GPU's decoder-8b record of the row
once a loan has measured one."""

from __future__ import annotations

from experiments import decoder_8b
from methods import roofline
from methods.roofline import MACHINES, SLUGS, Machine
from suite.config import paths
from suite.core.experiment import Metric, ProjectedRow, ProjectingExperiment, Row
from suite.measure.flops import peak_tflops
from suite.records.index import Index, open_index
from suite.records.schema import machine_of, status_of

NOT_PROJECTED = ("8b-amp", "7b-amp")  # past the device at full depth (counted oom): nothing to project
# The update on the device is preferred only where its step is shorter by more than this: the roofline's floors
# (elementwise kernels, the tail) are not fine enough to choose on less
MARGIN = 1.05


def rows(profile: str) -> list[Row]:
    return [
        ProjectedRow(
            f"{machine}-{row.name}",
            row.method,
            row.overrides,
            {"machine": machine, **row.labels},
            projection={
                "machine": machine,
                "reference": {"machine": SLUGS[machine], "experiment": "decoder-8b", "row": row.name},
            },
        )
        for machine in MACHINES
        for row in decoder_8b.rows("paper")
        if row.name not in NOT_PROJECTED
    ]


EXPERIMENT = ProjectingExperiment(
    name="decoder-8b-roofline",
    title="Llama 3 8B (and Llama 2 7B's shape) on one GPU, projected: each row's roofline on an H100 and an H200",
    source="methods/roofline.py; the rows of decoder-8b (issue 54)",
    metrics=[
        Metric("tokens_per_s", "tokens/s (projected)", "{:.0f}", ratio=False, paper=False),
        Metric("tflops_6n", "TFLOPS (6N, projected)", "{:.0f}", ratio=False, paper=False),
        Metric("mfu", "MFU (projected)", "{:.0%}", ratio=False, paper=False),
        Metric("bound", "limit", "{}", ratio=False, paper=False),
        Metric("step_time", "step (s)", "{:.3g}", ratio=False, paper=False),
        Metric("pcie_gb", "PCIe a step (GB)", "{:.3g}", ratio=False, paper=False),
        Metric("compute_s", "compute (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("h2d_s", "uploads (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("d2h_s", "downloads (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("host_s", "host (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("tail_s", "in series (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("elementwise_s", "of compute: non-matmul kernels (s)", "{:.3g}", ratio=False, paper=False, brief=False),
        Metric("host_ns_for_compute", "host update to keep up (ns a parameter)", "{:.3g}", ratio=False, paper=False),
        Metric(
            "device_update_tokens_per_s",
            "tokens/s, update on the device",
            "{:.0f}",
            ratio=False,
            paper=False,
            brief=False,
        ),
        Metric("update_best", "faster update", "{}", ratio=False, paper=False),
        Metric("reference", "measured (tokens/s)", "{:.0f}", ratio=False, paper=False),
        Metric("error", "error", "{:+.1%}", ratio=False, paper=False),
    ],
    label_columns=["machine", "model", "method"],
    baseline="h100-8b-8l-amp",
    rows=rows,
    base=lambda profile: decoder_8b.base("paper"),
    rounds=1,
    projected_kind="roofline",
    held_to=lambda run, metrics, index: held_to(run, metrics, index),
    notes=(
        "Projected, nothing measured: the section's machine is the one that made the projection, not the GPU it "
        "projects (the `machine` column). Each row's step from what it computes (the step's hardware FLOPs, recompute "
        "and the chunked LM head's logits made again included, at the GEMM rate; the kernels that are not matmuls by "
        "the bytes they move, at the device memory's rate: a floor), moves over PCIe each way and streams through host "
        "memory (L2L's update at the host's update rate a parameter), each at the "
        "machine's rate; the busiest resource is the `limit`, and `in series` what cannot overlap it (L2L: the "
        "embeddings' and first block's updates after the backward and the first upload; FSDP2's offload: its host "
        "optimizer after the backward; AMP: its optimizer on the device). `measured` is that GPU's decoder-8b record "
        "of the row where a loan has made one, `error` the projection against it. `host update to keep up` is the rate "
        "a parameter at which L2L's host would take exactly the compute's time (a gated row's: the next forward's): a "
        "host slower than it bounds the step. `tokens/s, update on the device`: the same row with L2L's AdamW on the "
        "device, each layer's FP32 master and moments over the link both ways (methods/roofline.py), and `faster "
        "update` the place the roofline prefers on this machine kind (the device only where its step is shorter by "
        "more than 5%: the roofline's floors cannot choose on less). "
        "MFU is the suite's one definition "
        "(suite/measure/flops.py: model FLOPs, matmuls only, no recompute, over the dense peak of the precision), the "
        "same as every measured row's; TFLOPS (6N) is the offloading papers' 6 x parameters x tokens a second, which "
        "counts the embeddings and no attention: the two differ, and neither is the other over the peak. Rates, per "
        "machine: "
        + " ".join(
            f"**{k}**: " + "; ".join(f"{part}: {why}" for part, why in m.sources.items()) + "."
            for k, m in MACHINES.items()
        )
    ),
)


def _latest(index: Index, experiment: str, row: str, slug: str, key: str) -> dict | None:
    """The latest finished `paper` record of experiment/row on a machine whose slug starts with `slug`, as run by its
    own definition (no --set variant), that has a number at metrics[key]."""
    return index.latest(
        experiment,
        row,
        slug,
        where=lambda rec: (
            status_of(rec).kind == "ok"
            and not rec.get("variant")
            and isinstance((rec.get("metrics") or {}).get(key), (int, float))
        ),
    )


def rates(key: str, index: Index) -> Machine:
    """The roofline's machine of kind `key`: the catalogue's, its rates a lent GPU of that kind measured in place of
    the assumed ones where one has (the index's `machine`: its latest bench-link record)."""
    return roofline.machine(index.machine(key))


def held_to(run, metrics: dict, index: Index) -> dict:
    """The tokens a second of the GPU's record of the row that the projection names (a machine's slug prefix, an
    experiment and a row), read from the records as the table is rendered, and the projection's error against it."""
    ref = (run.options.get("projection") or {}).get("reference")
    rec = ref and _latest(index, ref["experiment"], ref["row"], ref["machine"], "tokens_per_s")
    if not ref:
        return {"reference": None, "reference_of": "none: a projection only", "error": None}
    if not rec:
        what = f"no {ref['machine'].rstrip('-')} record of {ref['experiment']}/{ref['row']} yet"
        return {"reference": None, "reference_of": what, "error": None}
    measured, projected = rec["metrics"]["tokens_per_s"], metrics.get("tokens_per_s")
    return {
        "reference": measured,
        "reference_of": f"{machine_of(rec)} record {ref['experiment']}/{ref['row']}",
        "error": (projected - measured) / measured if projected else None,
    }


def device_update(run, spec: Machine) -> dict:
    """For an L2L row, its step with the update on the device (issue 63, item 3: the master and moments over the
    link), and where the update is faster on this machine kind, the device's or the host's."""
    if not roofline.updates_on_device(run):
        return {}
    host = roofline.project(run, spec, update="host")
    dev = roofline.project(run, spec, update="device")
    return {
        "device_update_tokens_per_s": dev.tokens_per_s,
        "device_update_bound": dev.bound,
        "update_best": "device" if dev.step_s * MARGIN < host.step_s else "host",
    }


def roofline_cell(run, device, cap, index: Index | None = None) -> dict:
    """The `roofline` cell kind: run.options["projection"] names the machine (a MACHINES key); the roofline
    (methods/roofline.py) is handed its rates and computes alone. What it is held to is read when the table is
    rendered (held_to). `index`: the records whose rates it takes (the suite's results folder's where not given: the
    estimate hands the one it prices from)."""
    p = run.options["projection"]
    spec = rates(p["machine"], index if index is not None else open_index(paths.RESULTS_DIR))
    out = roofline.project(run, spec)
    peak = peak_tflops(spec.gpu, run.precision)
    tflops = out.flops / out.step_s / 1e12
    return {
        "tokens_per_s": out.tokens_per_s,
        "tflops_6n": 6 * out.parameters * out.tokens_per_s / 1e12,
        "model_tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "step_time": out.step_s,
        "pcie_gb": out.pcie_bytes / 1e9,
        "compute_s": out.compute_s,
        "h2d_s": out.h2d_s,
        "d2h_s": out.d2h_s,
        "host_s": out.host_s,
        "tail_s": out.tail_s,
        "elementwise_s": out.elementwise_s,
        "host_ns_for_compute": out.host_ns_for_compute,
        "bound": out.bound,
        **device_update(run, spec),
        "device_spec": spec.name,
        "assumptions": spec.sources,
    }
