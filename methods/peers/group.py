"""The process group a peer method joins: torchrun's when launched by it, else a one-rank group of its own."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from suite.config.errors import ConfigError


def join(world: int, device: torch.device, timeout_s: float = 300.0, counted: bool = False) -> tuple[int, int]:
    """(rank, world size) of the default group, joined if needed: torchrun's ranks through its env (gloo on CPU,
    NCCL on CUDA), or, for a one-rank run started without torchrun (`suite check`), an in-process group; for a
    counted one-rank step a fake group, whose collectives move nothing (a count's several ranks have one already)."""
    if counted and not dist.is_initialized():
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    if dist.is_initialized() and (dist.get_backend() == "fake") != counted:
        raise RuntimeError(f"a {'counted' if counted else 'real'} step found a {dist.get_backend()} process group")
    if not dist.is_initialized():
        kwargs: dict = dict(timeout=timedelta(seconds=timeout_s))
        if device.type == "cuda":
            torch.cuda.set_device(device)
            # gloo beside NCCL: offloaded shards (FSDP2's CPU offload) meet in collectives on the host.
            kwargs.update(backend="cuda:nccl,cpu:gloo", device_id=device)
        else:
            kwargs.update(backend="gloo")
        if "RANK" in os.environ:
            dist.init_process_group(**kwargs)
        elif world == 1:
            # The peers' libraries speak only through a process group, even to themselves.
            dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)
        else:
            raise ConfigError(
                f"this peer runs on {world} ranks: launch it with python -m torch.distributed.run "
                f"--nproc_per_node={world} (python -m suite run/check does)"
            )
    if dist.get_world_size() != world:
        raise ConfigError(f"this run needs {world} ranks, torch.distributed has {dist.get_world_size()}")
    return dist.get_rank(), dist.get_world_size()
