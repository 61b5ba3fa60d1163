"""torch's FSDP2 (`fully_shard`) as a peer: data parallel, every layer sharded, offloaded to the host on a GPU."""

from __future__ import annotations

import torch
import torch.distributed as dist

from methods.peers.group import join
from methods.peers.layers import RECOMPUTE, Layers
from suite.core.registry import Method, Option, StepStats, register
from suite.harness.data import MiniBatch
from suite.harness.device import DTYPES, flag, is_fake, place, scalar
from suite.harness.loss_scale import DynamicLossScaler
from suite.harness.optim import LayerwiseOptimizer


@register("fsdp-offload")
class FSDPOffload(Method):
    """FSDP2: one `fully_shard` unit per layer over `ranks` data-parallel ranks; CPUOffloadPolicy on a GPU."""

    peer = "torch FSDP2 (fully_shard)"
    # 16-bit: FSDP2's MixedPrecisionPolicy, 16-bit weights in the layers' compute over FP32 shards, gradients
    # reduced in FP32 (the analog of L2L-CMP); fp16 with the suite's dynamic loss scaling.
    precisions = ("fp32", "bf16", "fp16")
    shards_batch = True
    dist_check_module = "methods.peers.dist_check"
    steady_after = 1  # the first step's lazy init and all-gather buffers
    # FSDP2 keeps its state on the module (a copy per cell) and in the process group, which the worker leaves
    # after each cell: one-rank cells share the campaign's worker (tests/test_worker.py).
    shares_worker = True
    options = {
        "offload": Option(
            "auto",
            ("auto", "on", "off"),
            "CPUOffloadPolicy (parameters, gradients, optimizer on the host): auto = on with a GPU; on a CPU the "
            "parameters are on the host already, so auto runs plain FSDP2",
        ),
        "reshard": Option("on", ("on", "off"), "free the gathered parameters after each forward (ZeRO-3) or not"),
        "recompute": RECOMPUTE,
        "timeout": Option(300.0, help="seconds before process-group init or any collective fails the run"),
    }

    @classmethod
    def offloads(cls, opts: dict, device: torch.device) -> bool:
        return opts["offload"] == "on" or (opts["offload"] == "auto" and device.type == "cuda")

    @classmethod
    def count_allowance(cls, run) -> int:
        """A count (no offload on a CPU) keeps every FP32 parameter, gradient and optimizer moment on the device,
        at most 16 bytes a parameter (Adam's and LAMB's two moments); the accelerator's CPUOffloadPolicy keeps them
        on the host, and what it adds on the device (a block's gathered weights) the count holds too."""
        if run.options.get("offload", "auto") == "off":
            return 0
        from suite.harness.model import param_count

        return 16 * param_count(run.model)

    def __init__(self, model, run, device):
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        super().__init__(model, run, device)
        counted = is_fake(next(model.parameters()))
        self.rank, self.world = join(run.ranks, device, self.opts["timeout"], counted)
        self.offload = self.offloads(self.opts, device)
        # Pinned host memory needs an accelerator; a CPU build refuses it.
        policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if self.offload else OffloadPolicy()
        if not self.offload:
            place(model, device)
        with unset_fake_temporarily():  # the mesh reads its rank table's values, which a counted tensor has not
            mesh = init_device_mesh(device.type, (self.world,))
        mp = MixedPrecisionPolicy()
        if run.precision != "fp32":
            mp = MixedPrecisionPolicy(param_dtype=DTYPES[run.precision], reduce_dtype=torch.float32)
        kw = dict(mesh=mesh, offload_policy=policy, mp_policy=mp, reshard_after_forward=self.opts["reshard"] == "on")
        for layer in model.layers:
            fully_shard(layer, **kw)
        self.root = fully_shard(Layers(model, self.opts["recompute"] == "on"), **kw)
        for unit in [self.root, *model.layers]:
            # Sums, as grad_accum's: each rank's loss is already its share of the global minibatch. (Gloo has no
            # PREMUL_SUM, which a divide factor would otherwise take.)
            unit.set_force_sum_reduction_for_comms(True)
            unit.set_gradient_divide_factor(1.0)
        # Names now, after sharding: the parameters are the DTensors FSDP2 registered in place of the originals.
        self.layer_params = [model.layer_named_parameters(i) for i in range(model.num_layers)]
        self.params = [p for named in self.layer_params for _, p in named]
        self.opt = LayerwiseOptimizer(self.layer_params, run)
        self.scaler = DynamicLossScaler(enabled=run.precision == "fp16")
        self.step_count = 0

    def step(self, batch: MiniBatch) -> StepStats:
        m, denom = self.run.num_micro_batches, batch.size * self.world
        total = torch.zeros((), device=self.device)
        for j, mb in enumerate(batch.split(m)):
            # Gradients stay local, unsharded, until the last micro-batch, whose backward reduce-scatters them.
            self.root.set_requires_gradient_sync(j == m - 1)
            ctx = self.model.begin(mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, denom)
            loss = self.root(ctx)
            self.scaler.scale_loss(loss).backward()
            total += loss.detach()
        skipped = False
        if self.scaler.enabled:  # on each rank's shards; an overflow anywhere skips the step everywhere
            found = self.scaler.unscale_([p.grad.to_local() for p in self.params if p.grad is not None])
            if self.world > 1:
                dist.all_reduce(found, op=dist.ReduceOp.MAX)
            skipped = flag(found)
            self.scaler.update(skipped)
        if not skipped:
            if self.run.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(self.params, self.run.clip_grad_norm)
            self.opt.step(self.step_count)
        for p in self.params:
            p.grad = None
        if self.world > 1:
            dist.all_reduce(total)
        self.step_count += 1
        # samples: this rank's, as every data-parallel method reports
        extra = {"loss_scale": self.scaler.scale}
        return StepStats(loss=scalar(total), samples=batch.size, skipped=skipped, extra=extra)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full FP32 weights by HF name on CPU, gathered on every rank (collective)."""
        return {n: p.full_tensor().detach().float().cpu().clone() for named in self.layer_params for n, p in named}

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        local = [p.to_local() for p in self.params]
        grads = [p.grad.to_local() for p in self.params if p.grad is not None]
        return {"parameters": local, "gradients": grads, "optimizer": self.opt.state_tensors()}

    def resident_device_bytes(self) -> int:
        if self.offload:
            return 0  # shards, gradients and optimizer state live on the host between steps
        own = sum(p.to_local().numel() * p.element_size() for p in self.params)
        return own + self.opt.state_bytes()
