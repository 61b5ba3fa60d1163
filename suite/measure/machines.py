"""The machine catalogue: each kind of machine the suite names, once, with every figure's source.

A kind has the prefix its records' machine slugs start with (where a lent machine of it has records), the name torch
reports for its GPU, its dense peak TFLOPS per precision, its device's and host's memory, and the rates of its link,
host and device memory. A peak is its datasheet's; a rate is assumed (a round figure, its reason in `source`) until a
lent machine of the kind measures it: the index gives the kind with its latest `bench-link` record's rates in their
place (`measured` here; suite/records/index.py `machine`), each source naming the record. The flops module's peaks,
the estimate's lent kinds, the roofline's machines and the L2L projection's devices read this catalogue; none keeps a
table of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Figure:
    """One figure of a machine and where it comes from: `datasheet: ...`, `assumed: ...` or `measured: ...`."""

    value: float
    source: str


@dataclass(frozen=True)
class Kind:
    """One kind of machine (see the module). Memory in GB (device) and GiB (host: what `free` reports)."""

    name: str
    title: str
    gpu: str  # the device name torch reports; the first kind whose `gpu` is in it gives a device's peaks
    peaks: dict[str, float]  # dense TFLOPS (no sparsity) by precision, from the datasheet
    device_gb: float
    slug: str = ""  # the prefix of the machine slugs of its records ("" where no lent machine of it has any)
    host_gib: float | None = None  # the lent machine's host memory, where one is lent
    rates: dict[str, Figure] = field(default_factory=dict)  # h2d_gbps, d2h_gbps, host_gbps, device_gbps, ...

    def rate(self, name: str) -> float:
        return self.rates[name].value


def _link(gbps: float, source: str) -> dict[str, Figure]:
    """A link's rate, the same each way."""
    return {"h2d_gbps": Figure(gbps, source), "d2h_gbps": Figure(gbps, source)}


_GEN5 = "assumed: PCIe Gen5 x16, 50 GB/s effective of 63 per direction"
_HOST16 = "assumed: 100 GB/s streaming at 16 cores (a server's is 75-150)"
_UPDATE16 = (
    "assumed: AdamW's 28 bytes a parameter in one pass at the assumed host bandwidth; a lent host's bench-link record "
    "(L2L's own update) or bench-host-optim record (the suite's fused AdamW over a layer) replaces it"
)
_H100_PEAKS = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
H100 = Kind(
    "h100",
    "H100 80GB HBM3 SXM, PCIe Gen5 x16, a 16-core host",
    "H100",
    _H100_PEAKS,
    device_gb=80,
    slug="h100-",
    host_gib=126,  # what the lent machines' environment reports give (results/campaign/<machine>/environment.json)
    rates={
        **_link(50.0, _GEN5),
        "host_gbps": Figure(100.0, _HOST16),
        "host_update_ns": Figure(0.28, _UPDATE16),
        "device_gbps": Figure(3000.0, "assumed: 3.0 TB/s of the HBM3's 3.35"),
        "gemm_tflops": Figure(
            600.0,
            "assumed: 61% of the 989 TFLOPS dense bf16 peak in 4096-token Llama matmuls and flash attention "
            "(cuBLAS reaches 600-700 at these shapes; the suite's own measurement is bench-link's)",
        ),
        "attention_tflops": Figure(
            500.0, "assumed: as counted (every query against every key: a causal kernel does half that work)"
        ),
    },
)

KINDS: dict[str, Kind] = {
    # Order matters where one GPU's name holds another's: the PCIe and NVL parts before the SXM part, GH200 before
    # H200.
    "h100-pcie": Kind(
        "h100-pcie",
        "H100 PCIe",
        "H100 PCIe",
        {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
        80,
        slug="h100-pcie",
    ),
    "h100-nvl": Kind(
        "h100-nvl",
        "H100 NVL",
        "H100 NVL",
        {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0},
        94,
        slug="h100-nvl",
    ),
    "h100": H100,
    "gh200": replace(
        H100,
        name="gh200",
        title="GH200 (H100 96GB + Grace, NVLink-C2C)",
        gpu="GH200",
        device_gb=96,
        slug="",
        host_gib=None,
        rates={
            **H100.rates,
            **_link(350.0, "assumed: NVLink-C2C, 350 GB/s effective of 450 per direction"),
        },
    ),
    "h200": replace(
        H100,
        name="h200",
        title="H200 141GB HBM3e SXM, PCIe Gen5 x16, a 16-core host",
        gpu="H200",
        device_gb=141,
        slug="h200-",
        rates={
            **H100.rates,
            "device_gbps": Figure(4300.0, "assumed: 4.3 TB/s of the HBM3e's 4.8"),
            "gemm_tflops": Figure(600.0, "assumed: the H100's (the same compute)"),
        },
    ),
    "a100": Kind(
        "a100",
        "A100 80GB SXM, PCIe Gen4 x16",
        "A100",
        {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        80,
        rates={
            **_link(25.0, "assumed: PCIe Gen4 x16, 25 GB/s effective of 31.5 per direction"),
        },
    ),
    "v100": Kind(
        "v100",
        "V100-16GB SXM2, PCIe Gen3 x16 (the L2L paper's machine)",
        "V100",
        {"fp32": 15.7, "fp16": 125.0},
        16,
        rates={
            **_link(11.0, "assumed: PCIe Gen3 x16, 11 GB/s effective of 15.75 per direction"),
        },
    ),
}
LENT = ("h100", "h200")  # the kinds a GPU campaign is lent (their records' slugs start with their `slug`)


def kind(name: str) -> Kind:
    """The kind called `name` (a KeyError names the known kinds)."""
    if name not in KINDS:
        raise KeyError(f"no machine kind {name!r}: one of {', '.join(KINDS)}")
    return KINDS[name]


def of_device(device_name: str) -> Kind | None:
    """The kind of a GPU torch names `device_name` (its first kind whose `gpu` the name holds), else None."""
    return next((k for k in KINDS.values() if k.gpu.lower() in device_name.lower()), None)


def of_slug(slug: str) -> Kind | None:
    """The kind a machine's slug names (its records' `machine`): the longest slug that starts it (an H100 NVL's
    `h100-nvl-...` is not the SXM's `h100-...`), else None."""
    named = sorted((k for k in KINDS.values() if k.slug and slug.startswith(k.slug)), key=lambda k: -len(k.slug))
    return named[0] if named else None


# bench-link's figures (experiments/benchmarks/link.py) and the rates they measure
BENCH_RATES = {
    "gemm_tflops": "gemm_tflops",
    "attention_tflops": "attention_tflops",
    "h2d_gbps": "h2d_gbps",
    "d2h_gbps": "d2h_gbps",
    "triad_gbps": "host_gbps",
    "host_ns_per_param": "host_update_ns",  # L2L's windowed host AdamW at a block, every pass of it
}


def measured(kind: Kind, metrics: dict, where: str) -> Kind:
    """`kind` with each rate a bench-link record measured (its `metrics`: a number) in place of the assumed one, its
    source `where` (the record: its machine and date)."""
    got = {
        rate: Figure(float(metrics[key]), where)
        for key, rate in BENCH_RATES.items()
        if isinstance(metrics.get(key), (int, float))
    }
    return replace(kind, rates={**kind.rates, **got})


def stated_sizes() -> set[tuple[float, str]]:
    """Every memory size the catalogue states, as prose names them: (80, "GB"), (126, "GiB")."""
    out = {(k.device_gb, "GB") for k in KINDS.values()}
    return out | {(k.host_gib, "GiB") for k in KINDS.values() if k.host_gib}
