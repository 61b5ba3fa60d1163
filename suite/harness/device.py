"""Device resolution, autocast and synchronisation helpers shared by methods and measurement."""

from __future__ import annotations

import contextlib
import threading

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """'auto' picks CUDA when present; on CUDA each rank takes its local GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda was asked for but torch sees no CUDA device; use device=cpu or auto")
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def device_type(name: str) -> str:
    """The type of device a run's `device` setting takes on this machine ('auto' is CUDA where torch sees one)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name).type


def autocast(device: torch.device, precision: str):
    """torch.autocast for 16-bit precisions, a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_fake(t) -> bool:
    """A tensor of a counted step: shapes and devices without data (FakeTensorMode)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def scalar(t) -> float:
    """float(t), or NaN in a counted step, whose tensors hold no value to report."""
    return float("nan") if is_fake(t) else float(t)


def flag(t, counted: bool = False) -> bool:
    """bool(t), or `counted` in a counted step: a branch on data (an fp16 overflow, padding) takes the
    path a step normally takes."""
    return counted if is_fake(t) else bool(t)


def read_step(loss: torch.Tensor, found: torch.Tensor | None = None) -> tuple[float, bool]:
    """(loss, overflowed): a step's one read-back of the device, the loss with (under fp16 scaling) the overflow
    flag beside it in one transfer. A counted step reads nothing: NaN, and the path a step normally takes."""
    if is_fake(loss):
        return float("nan"), False
    if found is None:
        return float(loss), False
    value, overflow = torch.stack([loss.detach().float().reshape(()), found.float().sum().to(loss.device)]).tolist()
    return value, overflow != 0


_host = threading.local()


def host_flag(t: torch.Tensor) -> bool:
    """bool(t) of a tensor the host already holds (a host optimizer's overflow flags): no device is waited for.
    Refuses a tensor on a device; a counted step's fake one reads False."""
    if is_fake(t):
        return False
    if t.device.type != "cpu":
        raise ValueError(f"host_flag reads host tensors; this one is on {t.device}: read it with the step's loss")
    _host.reading = True
    try:
        return bool(t)
    finally:
        _host.reading = False


def reading_host() -> bool:
    """Whether the current thread is inside host_flag (a read that is no device synchronisation)."""
    return getattr(_host, "reading", False)


def drop(module: torch.nn.Module) -> None:
    """Let go of a module's tensors (another rank's layers) by moving them to `meta`. A counted step's fake
    parameters cannot be swapped in place, so there new meta Parameters replace them."""
    if not any(is_fake(p) for p in module.parameters()):
        module.to("meta")
        return
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                mod._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        for name, b in mod._buffers.items():
            if b is not None:
                mod._buffers[name] = torch.empty_like(b, device="meta")


def place(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module.to(device)`, skipped when every tensor is already there: a counted step's fake parameters
    cannot be swapped for copies of themselves."""
    if all(t.device == torch.device(device) for t in [*module.parameters(), *module.buffers()]):
        return module
    return module.to(device)


def leave_group() -> None:
    """Leave a real default process group together: under torch 2.11 a gloo rank torn down before its peer can
    abort at exit (SIGABRT) after its work passed. No-op without a group, or with a count's fake one."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() != "fake":
        dist.barrier()
        dist.destroy_process_group()
