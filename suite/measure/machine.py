"""The machine a number came from: CPU and kernel-picking ISA, cores, RAM, GPU, versions, and a short slug."""

from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata

import torch

from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.host import ram_bytes

# CPU flags that change which kernels torch picks (and so the answer): bf16 autocast on an AVX2-only
# CPU ran at 0.26x FP32 where AVX512-BF16 or AMX runs it natively.
KERNEL_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# Marketing words that say nothing about the part.
_NOISE = re.compile(r"\((r|tm)\)|\b(cpu|processor|amd|intel|genuine|\d+-core)\b|@.*$", re.I)


def _cpuinfo() -> list[dict[str, str]]:
    """One dict per logical CPU from /proc/cpuinfo (empty off Linux)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return []
    cpus = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        cpus.append({k.strip(): v.strip() for k, v in fields.items()})
    return cpus


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_fingerprint() -> dict:
    """Model, family/model/stepping, kernel-picking flags, torch's CPU capability, cores, threads, RAM."""
    cpus = _cpuinfo()
    first = cpus[0] if cpus else {}
    flags = set(first.get("flags", "").split())
    physical = {(c.get("physical id"), c.get("core id")) for c in cpus if "core id" in c}
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "model": first.get("model name") or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "family_model_stepping": [first.get("cpu family"), first.get("model"), first.get("stepping")],
        "flags": [f for f in KERNEL_FLAGS if f in flags],
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "physical_cores": len(physical) or None,
        "logical_cores": os.cpu_count(),
        "usable_cores": affinity,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "ram_bytes": ram_bytes(),
    }


def gpu_fingerprint() -> dict | None:
    """Name, memory, compute capability, count, CUDA and driver versions of the visible GPUs (None without)."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    driver = None
    try:
        driver = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
    except Exception:  # noqa: BLE001 — a missing driver query must not lose the record
        driver = None
    return {
        "name": props.name,
        "memory_bytes": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
        "count": torch.cuda.device_count(),
        "cuda": torch.version.cuda,
        "driver": driver,
    }


def _plain(name: str) -> str:
    """A model name as a folder's: every run of characters but letters, digits, '.' and '_' one '-' (a "w/" in
    `AMD Ryzen 7 PRO 4750U w/ Radeon Graphics` made the records' folder one level too deep, where no table looked)."""
    return re.sub(r"[^a-z0-9._]+", "-", name.lower()).strip("-.")


def _cpu_slug(cpu: dict) -> str:
    words = _NOISE.sub(" ", cpu["model"] or "").lower().split()
    name = _plain("-".join(w for w in words if w)) or cpu["arch"]
    if not any(ch.isdigit() for ch in name):  # "AMD EPYC" alone: the family and model tell the part
        fam, mod, _ = cpu["family_model_stepping"]
        if fam is not None:
            name += f"-f{fam}m{mod}"
    flags = cpu["flags"]
    isa = next(
        (
            tag
            for flag, tag in (
                ("amx_bf16", "amx"),
                ("avx512_bf16", "avx512bf16"),
                ("avx512f", "avx512"),
                ("avx2", "avx2"),
            )
            if flag in flags
        ),
        cpu["arch"],
    )
    return f"cpu-{name}-{isa}-{cpu['usable_cores']}c"


def _gpu_slug(gpu: dict) -> str:
    name = re.sub(r"\b(nvidia|geforce|tesla|hbm\d*e?|pcie|sxm\d*|\d+gb)\b", " ", gpu["name"].lower())
    name = _plain("-".join(name.split())) or "gpu"
    slug = f"{name}-{round(gpu['memory_bytes'] / 2**30)}gb"  # 80 GB H100: 79.6 GiB
    return f"{gpu['count']}x-{slug}" if gpu["count"] > 1 else slug


def slug(cpu: dict, gpu: dict | None) -> str:
    """A short stable name for tables: the GPU's when there is one, else the CPU's; SUITE_MACHINE overrides it."""
    override = os.environ.get("SUITE_MACHINE", "").strip()
    if override:
        # `my lab box`: my-lab-box. Only white space is rewritten: `labé` and `labü` would both become `lab-`, one
        # machine's records then taken for the other's, so any other character is refused.
        name = re.sub(r"\s+", "-", override)
        if not paths.plain(name):
            raise ConfigError(
                f"SUITE_MACHINE={override!r}: give a plain name (up to 100 ASCII letters, digits, '.', '_', '-', not "
                "starting with '.' or '-'): it names the machine's folder under results/runs/"
            )
        return name
    return _gpu_slug(gpu) if gpu else _cpu_slug(cpu)


def fingerprint() -> dict:
    """Everything that tells one machine's numbers from another's, with its slug."""
    cpu, gpu = cpu_fingerprint(), gpu_fingerprint()
    return {
        "slug": slug(cpu, gpu),
        "cpu": cpu,
        "gpu": gpu,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "host": platform.node(),
    }


def describe(fp: dict) -> str:
    """One hardware line for a table section."""
    cpu, gpu = fp["cpu"], fp.get("gpu")
    ram = f"{cpu['ram_bytes'] / 2**30:.0f} GiB RAM" if cpu.get("ram_bytes") else "RAM unknown"
    line = (
        f"{cpu['model']} ({cpu['arch']}, {', '.join(cpu['flags']) or 'no AVX2'}; torch kernels "
        f"{cpu['torch_capability']}), {cpu['usable_cores']} usable of {cpu['logical_cores']} logical cores, {ram}"
    )
    if gpu:
        line = (
            f"{gpu['count']} x {gpu['name']} ({gpu['memory_bytes'] / 1e9:.0f} GB, sm {gpu['capability']}, CUDA "
            f"{gpu['cuda']}, driver {gpu['driver'] or '?'}); host " + line
        )
    return f"{line}; Python {fp['python']}, torch {fp['torch']}, transformers {fp['transformers']}"
