"""torch.distributed.pipelining's schedules as peer methods: torch drives the suite's layers, stages and optimizer."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn

from methods.peers.group import join
from methods.pipeline.executors.stage import Stage, clip_coefficient
from methods.pipeline.method import split_layers
from suite.config.errors import ConfigError
from suite.core.registry import Method, Option, StepStats, register
from suite.harness.data import MiniBatch
from suite.harness.device import drop, is_fake, resolve_device, scalar


class TorchStageModule(nn.Module):
    """One pipeline stage of the suite's layers as the module torch drives. The `mb` keyword (a micro-batch
    index, chunked by torch like every input) picks the context (labels, mask, dropout keys), which a
    tensor-only interface cannot carry; the first stage reads its micro-batch from there too."""

    def __init__(self, stage: Stage, recompute: bool = False):
        super().__init__()
        self.stage, self.recompute = stage, recompute
        self.blocks = nn.ModuleList(stage.model.layers[i] for i in stage.layers)  # registers the parameters
        self.ctxs: list = []

    def forward(self, x, mb):
        # A counted step's index has no value; its micro-batches differ in values only, so any context will do.
        ctx = self.ctxs[0 if is_fake(mb) else int(mb)]
        model = self.stage.model
        x = ctx.mb if self.stage.first else x
        for i in self.stage.layers:
            if self.recompute and 0 < i < model.num_layers - 1:
                # Each block keeps only its input; the keyed dropout masks make the recompute exact.
                x = torch.utils.checkpoint.checkpoint(model.forward_layer, i, x, ctx, use_reentrant=False)
            else:
                x = model.forward_layer(i, x, ctx)
        out = x
        if self.stage.last:
            ctx.logits = None  # read only by evaluation; would hold batch x seq x vocab until the step ends
        return out


def gloo_mixes_p2p() -> bool:
    """Whether this torch's gloo runs a batch mixing sends and receives (2.13 does; 2.11 fails it)."""
    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


def stage_indices(placement: str, rank: int, ranks: int, per_rank: int) -> list[int]:
    """The global stage indices rank `rank` holds: one stage; `loop` (stage s on rank s mod ranks); or `v`
    (rank r holds r and 2*ranks-1-r, so rank 0 holds the first and the last stage)."""
    if placement == "single":
        return [rank]
    if placement == "loop":
        return [rank + k * ranks for k in range(per_rank)]
    return [rank, 2 * ranks - 1 - rank]


class TorchPipeline(Method):
    """One torch schedule over `ranks` processes (one per pipeline rank); each rank holds its stages' layers, the
    suite's per-layer optimizer steps them after torch's step. The loss arrives already divided by the minibatch
    size, so torch's gradient scaling is off (`scale_grads=False`): gradients are grad_accum's sums."""

    schedule_class: ClassVar[str] = ""
    placement: ClassVar[str] = "single"  # single | loop | v
    precisions = ("fp32",)
    shards_batch = False  # every rank builds every micro-batch's context (labels, mask, keys)
    dist_check_module = "methods.peers.dist_check"
    steady_after = 1  # torch allocates its receive buffers and caches in the first step
    peer = "torch.distributed.pipelining"
    uncounted = (
        "torch's schedules settle each stage's mode by a vote they read back (.item()) before the first step, "
        "which a counted step's tensors cannot answer"
    )
    scale_grads: ClassVar[bool] = False  # the loss is already a share of the minibatch's
    options: ClassVar[dict[str, Option]] = {}  # set per schedule below (`virtual` where stages loop)

    @classmethod
    def resolved_options(cls, run) -> dict:
        return {k: run.options.get(k, o.default) for k, o in cls.options.items()}

    @classmethod
    def world_size(cls, run) -> int:
        return cls.resolved_options(run)["stages"]

    @classmethod
    def per_rank(cls, opts: dict) -> int:
        return {"single": 1, "v": 2}.get(cls.placement, opts.get("virtual", 1))

    @classmethod
    def check_config(cls, run) -> None:
        super().check_config(run)
        o = cls.resolved_options(run)
        d, m, layers = o["stages"], run.num_micro_batches, run.model.resolved().layers + 2
        v = cls.per_rank(o)
        total = d * v
        if d < 1 or v < 1:
            raise ConfigError(f"stages={d}, virtual={v}: both must be at least 1")
        if run.ranks != 1:
            raise ConfigError(f"ranks={run.ranks}: a pipeline takes its ranks from stages; keep ranks=1")
        if not run.model.pretrained and total > layers:
            raise ConfigError(
                f"{cls.name}: {d} ranks x {v} stages each = {total} stages, but the model has {layers} layers "
                f"(embeddings, blocks, head): choose stages <= {layers // v}"
            )
        # torch's own constraints, said before any process starts (torch raises them inside every rank).
        if cls.schedule_class in ("Schedule1F1B", "ScheduleDualPipeV") and m < total:
            raise ConfigError(
                f"{cls.name} needs num_micro_batches >= its {total} stages, got {m}: set num_micro_batches={total}"
            )
        if cls.schedule_class in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"):
            rounds = max(1, m // d)
            if m % rounds:
                raise ConfigError(
                    f"{cls.name} needs num_micro_batches a multiple of its rounds (max(1, m // stages) = {rounds}), "
                    f"got {m}: choose a multiple of stages={d}"
                )
        if cls.placement == "v" and d > 1 and resolve_device(run.device).type == "cpu" and not gloo_mixes_p2p():
            raise ConfigError(
                f"{cls.name} on gloo needs torch >= 2.13: torch {torch.__version__}'s gloo fails the V schedules' "
                "first mixed send/receive batch ('Pair is not connected'); use NCCL or a newer torch"
            )

    def __init__(self, model, run, device):
        super().__init__(model, run, device)
        type(self).check_config(run)
        self.d, self.v, self.m = self.opts["stages"], self.per_rank(self.opts), run.num_micro_batches
        self.rank, _ = join(self.d, device, self.opts["timeout"])
        total = self.d * self.v
        ranges = split_layers(model, total)
        mine = stage_indices(self.placement, self.rank, self.d, self.v)
        for i in set(range(model.num_layers)) - {i for s in mine for i in ranges[s]}:
            drop(model.layers[i])  # other ranks' layers: not this rank's to hold
        self.stages = [Stage(model, ranges[s], s, device, False, run) for s in mine]
        self.modules_ = [TorchStageModule(st, self.opts["recompute"]) for st in self.stages]
        self.total = total
        self.step_count = 0
        self._schedule, self._shape = None, None

    def _build(self, seq: int):
        """torch's stages and schedule for activations of `seq` tokens, in static mode: given the boundary
        shapes (meta tensors), torch runs no shape-inference forward (it would draw dropout keys)."""
        from torch.distributed import pipelining

        b, hidden = self.run.micro_batch_size, self.model.cfg.hidden
        act = torch.empty(b, seq, hidden, device="meta", requires_grad=True)
        index = torch.empty(1, dtype=torch.long, device="meta")
        pstages = [
            pipelining.PipelineStage(
                mod,
                st.index,
                self.total,
                self.device,
                input_args=(index if st.first else act),
                output_args=torch.empty((), device="meta") if st.last else act,
            )
            for st, mod in zip(self.stages, self.modules_)
        ]
        cls = getattr(pipelining, self.schedule_class)
        kwargs = dict(loss_fn=lambda out, target: out, scale_grads=self.scale_grads)
        return cls(pstages[0] if self.placement == "single" else pstages, self.m, **kwargs)

    def _gradients(self, batch: MiniBatch) -> torch.Tensor:
        """Every micro-batch's forward and backward through torch's schedule; returns the loss (every rank)."""
        seq = int(batch.input_ids.shape[1])
        if self._shape != seq:
            self._schedule, self._shape = self._build(seq), seq
        ctxs = [
            self.model.begin(mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, batch.size)
            for mb in batch.split(self.m)
        ]
        for mod in self.modules_:
            mod.ctxs = ctxs
        index = torch.arange(self.m, device=self.device)
        losses: list = []
        first = any(st.first for st in self.stages)
        args = (index,) if first else ()
        # Every rank passes a target: torch indexes it on the last stage; the loss needs none (it is the output).
        self._schedule.step(*args, target=index, losses=losses, return_outputs=False, mb=index)
        loss = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        if self.d > 1:
            dist.all_reduce(loss)  # only the last stage's rank holds it
        return loss

    def step(self, batch: MiniBatch) -> StepStats:
        loss = self._gradients(batch)
        clip = self.run.clip_grad_norm
        if clip > 0:
            sq = torch.stack([st.grad_sq_norm() for st in self.stages]).sum()
            if self.d > 1:
                dist.all_reduce(sq)
            coef = clip_coefficient(sq, clip)
            for st in self.stages:
                st.scale_grads(coef)
        for st in self.stages:
            st.update(self.step_count)
        self.step_count += 1
        return StepStats(loss=scalar(loss), samples=batch.size)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """FP32 weights by HF name on CPU, gathered from every rank to every rank (collective)."""
        mine = {k: v for st in self.stages for k, v in st.state_dict().items()}
        if self.d == 1:
            return mine
        every: list = [None] * self.d
        dist.all_gather_object(every, mine)
        return {k: v for part in every for k, v in part.items()}

    def resident_device_bytes(self) -> int:
        return sum(st.resident_bytes() for st in self.stages)

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        roles = [st.memory_roles() for st in self.stages]
        return {k: [t for r in roles for t in r[k]] for k in ("parameters", "gradients", "optimizer", "stash")}


def _options(placement: str) -> dict[str, Option]:
    opts = {
        "stages": Option(2, help="pipeline ranks (one process each)"),
        "recompute": Option(False, help="checkpoint every block: keep its input, recompute it in the backward"),
        "timeout": Option(300.0, help="seconds before process-group init or any wait fails the run"),
    }
    if placement == "loop":
        opts["virtual"] = Option(2, help="stages per rank (rank r holds stages r, r+stages, ...)")
    return opts


def _peer(name: str, schedule_class: str, placement: str, doc: str):
    cls = type(
        schedule_class,
        (TorchPipeline,),
        {
            "__doc__": doc,
            "__module__": __name__,
            "schedule_class": schedule_class,
            "placement": placement,
            "options": _options(placement),
        },
    )
    return register(name)(cls)


_peer("torch-gpipe", "ScheduleGPipe", "single", "torch's GPipe: all forwards, then all backwards")
_peer("torch-1f1b", "Schedule1F1B", "single", "torch's 1F1B (PipeDream-Flush's schedule)")
_peer(
    "torch-interleaved-1f1b",
    "ScheduleInterleaved1F1B",
    "loop",
    "torch's interleaved 1F1B: `virtual` stages per rank, looped placement",
)
_peer(
    "torch-looped-bfs",
    "ScheduleLoopedBFS",
    "loop",
    "torch's looped BFS: every forward of a local stage before the next",
)
_peer(
    "torch-zero-bubble",
    "ScheduleInterleavedZeroBubble",
    "loop",
    "torch's interleaved zero-bubble: backward split into input and weight gradients",
)
_peer("torch-zbv", "ScheduleZBVZeroBubble", "v", "torch's zero-bubble V: 2 stages per rank in V placement")
_peer("torch-dualpipev", "ScheduleDualPipeV", "v", "torch's DualPipeV: 2 stages per rank in V placement")
