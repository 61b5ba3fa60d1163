"""DeepSpeed's ZeRO-Offload (stage 2, optimizer on the host) and ZeRO-Infinity-style stage 3 as peers."""

from __future__ import annotations

import os
from typing import ClassVar

import torch
import torch.distributed as dist

from methods.peers import deepspeed_ops
from methods.peers.group import join
from methods.peers.layers import RECOMPUTE, Layers
from suite.config.errors import ConfigError
from suite.core.registry import Method, Option, StepStats, register
from suite.harness.data import MiniBatch
from suite.harness.device import scalar
from suite.harness.optim import Lamb, lr_at, no_decay

INSTALL = "DS_BUILD_OPS=0 pip install -e '.[peers]' (DeepSpeed 0.19.8), then python -m methods.peers.deepspeed_ops"


class DeepSpeedOffload(Method):
    """ZeRO stage `stage` with the optimizer (and at stage 3 the parameters) offloaded to the host, DeepSpeed's
    engine driving the micro-batches (`gradient_accumulation_steps` = num_micro_batches)."""

    stage: ClassVar[int] = 2
    peer = "DeepSpeed ZeRO"
    uncounted = "DeepSpeed's engine builds flat buffers and runs its own C++ ops, for which fake tensors cannot stand"
    # bf16 through DeepSpeed's `torch_autocast` (FP32 weights, bf16 compute under torch.autocast: the suite's AMP);
    # its `bf16` section computes in bf16 throughout (LayerNorm and softmax too), a different method. No fp16: ZeRO
    # gives torch_autocast no loss scaler.
    precisions = ("fp32", "bf16")
    shards_batch = True
    dist_check_module = "methods.peers.dist_check"
    steady_after = 1
    options = {
        "host_adam": Option(
            "torch",
            ("torch", "deepspeed"),
            "optimizer=adamw's host kernel: torch's fused AdamW, or DeepSpeed's own CPU Adam (ZeRO-Offload's; it "
            "rounds differently, see the README)",
        ),
        "recompute": RECOMPUTE,
        "timeout": Option(300.0, help="seconds before process-group init or any collective fails the run"),
    }

    requires = ("deepspeed",)

    @classmethod
    def unavailable(cls) -> str | None:
        return f"DeepSpeed is not installed: {INSTALL}" if super().unavailable() else None

    @classmethod
    def check_config(cls, run) -> None:
        super().check_config(run)
        if run.optimizer == "lamb" and run.options.get("host_adam", "torch") == "deepspeed":
            raise ConfigError(f"{cls.name}: host_adam=deepspeed is an AdamW kernel; set optimizer=adamw with it")
        if run.optimizer == "lamb" and run.ranks > 1:
            # ZeRO hands the optimizer flat partitions: with one group per tensor, a tensor's own at one rank, but
            # a shard of it at several, where LAMB's trust ratio would see a shard's norm. (DeepSpeed's LAMB is a
            # CUDA kernel, with no CPU build.)
            raise ConfigError(
                f"{cls.name} runs optimizer=lamb on one rank only (ZeRO would shard each tensor and LAMB's trust "
                f"ratio needs the whole one), not ranks={run.ranks}: set ranks=1 or optimizer=adamw"
            )

    def config(self) -> dict:
        run, host = self.run, {"device": "cpu", "pin_memory": self.device.type == "cuda"}
        # DeepSpeed's default buckets hold 5e8 elements (2 GB in FP32) whatever the model; capped at the model's
        # size, so that a small model is not measured by buffers it cannot fill.
        bucket = int(min(5e8, sum(p.numel() for p in self.params)))
        zero = {
            "stage": self.stage,
            "offload_optimizer": host,
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
        }
        if self.stage == 3:
            # Every parameter partitioned and offloaded, the small ones too (DeepSpeed keeps those under 1e5
            # elements whole by default).
            zero.update(offload_param=host, stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size=bucket)
        return {
            "train_micro_batch_size_per_gpu": run.micro_batch_size // self.world,
            "gradient_accumulation_steps": run.num_micro_batches,
            "train_batch_size": run.micro_batch_size * run.num_micro_batches,
            # DeepSpeed's default clips at 1.0, silently: 0 turns it off, as the suite's clip_grad_norm=0 does.
            "gradient_clipping": run.clip_grad_norm,
            "zero_optimization": zero,
            "zero_force_ds_cpu_optimizer": False,  # torch's AdamW and the suite's LAMB are client optimizers
            "zero_allow_untested_optimizer": True,  # LAMB: per-tensor groups, one rank (check_config)
            "torch_autocast": {"enabled": run.precision == "bf16", "dtype": "bfloat16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }

    def __init__(self, model, run, device):
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
        import deepspeed

        super().__init__(model, run, device)
        type(self).check_config(run)
        self.rank, self.world = join(run.ranks, device, self.opts["timeout"])
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asserts it; a one-rank run without torchrun has none
        deepspeed_ops.build(deepspeed_ops.wanted(self.opts["host_adam"] == "deepspeed"))  # built at set-up
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        self.layer_params = [model.layer_named_parameters(i) for i in range(model.num_layers)]
        named = [(n, p) for layer in self.layer_params for n, p in layer]
        self.params = [p for _, p in named]
        hyper = dict(lr=run.lr, betas=(run.beta1, run.beta2), eps=run.eps)
        if run.optimizer == "lamb":
            # One group per tensor: ZeRO flattens each group, and LAMB's trust ratio is per tensor.
            groups = [{"params": [p], "weight_decay": 0.0 if no_decay(n) else run.weight_decay} for n, p in named]
            opt = Lamb(groups, fused=True, **hyper)
        else:
            # Elementwise AdamW: two groups over all layers update as the suite's per-layer groups do.
            groups = [
                {"params": [p for n, p in named if not no_decay(n)], "weight_decay": run.weight_decay},
                {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
            ]
            if self.opts["host_adam"] == "deepspeed":
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                opt = DeepSpeedCPUAdam(groups, adamw_mode=True, fp32_optimizer_states=True, **hyper)
            else:
                opt = torch.optim.AdamW(groups, fused=True, **hyper)  # its tensors are on the host, offloaded
        self.engine, self.opt, _, _ = deepspeed.initialize(
            model=Layers(model, self.opts["recompute"] == "on"),
            optimizer=opt,
            config=self.config(),
            dist_init_required=False,
        )
        self.step_count = 0

    def step(self, batch: MiniBatch) -> StepStats:
        m, denom = self.run.num_micro_batches, batch.size * self.world
        lr = lr_at(self.run, self.step_count)
        for g in self.opt.param_groups:
            g["lr"] = lr
        total = torch.zeros((), device=self.device)
        for mb in batch.split(m):
            ctx = self.model.begin(mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, denom)
            loss = self.engine(ctx)
            # The loss is already this micro-batch's share of the global minibatch: no division by the accumulation
            # steps, and ZeRO's mean over ranks undone (exact where the rank count is a power of two).
            self.engine.backward(loss * self.world if self.world > 1 else loss, scale_wrt_gas=False)
            self.engine.step()  # DeepSpeed steps the optimizer at the last micro-batch only
            total += loss.detach()
        if self.world > 1:
            dist.all_reduce(total)
        self.step_count += 1
        return StepStats(loss=scalar(total), samples=batch.size)

    def resident_device_bytes(self) -> int:
        # Between steps stage 2 keeps the module's weights on the device (its optimizer and master copy on the
        # host); stage 3 keeps only partitions, offloaded to the host.
        return 0 if self.stage == 3 else sum(p.numel() * p.element_size() for p in self.params)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The FP32 master weights by HF name on CPU, gathered on every rank (collective)."""
        from deepspeed.utils import safe_get_full_fp32_param

        return {
            n: safe_get_full_fp32_param(p).detach().float().cpu().clone()
            for layer in self.layer_params
            for n, p in layer
        }


@register("deepspeed-offload")
class ZeroOffload(DeepSpeedOffload):
    """ZeRO-Offload: ZeRO stage 2, gradients partitioned, optimizer state and step on the host."""

    stage = 2


@register("deepspeed-infinity")
class ZeroInfinity(DeepSpeedOffload):
    """ZeRO-Infinity-style: ZeRO stage 3, parameters partitioned and offloaded to the host with the optimizer."""

    stage = 3
