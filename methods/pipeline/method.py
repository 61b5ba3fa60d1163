"""PipelineMethod: the Method contract for pipelines (GPipe, PipeDream-Flush, 2BW) over either executor."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
import torch.distributed as dist

from methods.pipeline.executors.reference import ReferenceExecutor
from methods.pipeline.executors.stage import Stage
from methods.pipeline.schedules.partition import partition
from methods.pipeline.schedules.schedule import COMPUTE, GENERATORS, OPTIMIZER_STEP, Action, Schedule
from methods.pipeline.schedules.validate import validate
from suite.config.errors import ConfigError
from suite.core.registry import Method, Option, StepStats
from suite.harness.data import MiniBatch
from suite.harness.device import drop


def pipeline_options(recompute: bool) -> dict[str, Option]:
    return {
        "executor": Option(
            "reference",
            ("reference", "dist"),
            "reference: every stage in one process (the oracle, one device); dist: one torchrun rank per stage replica",
        ),
        "stages": Option(2, help="pipeline depth d (contiguous layer ranges balanced by parameter count)"),
        "width": Option(
            1,
            help="replicas per stage w (parallel pipelines, gradients all-reduced); replica r "
            "runs the r-th contiguous 1/w of the micro-batches",
        ),
        "recompute": Option(recompute, help="stash only each stage's input and recompute its activations in backward"),
        "timeout": Option(300.0, help="seconds before process-group init or any wait fails the run (dist)"),
        "timeline": Option(False, help="synchronize CUDA around each action so measured timelines show kernel time"),
    }


VERSIONED = COMPUTE | {OPTIMIZER_STEP}


def step_actions(schedule: Schedule, step: int, stages=None) -> list[list[Action]]:
    """The actions of optimizer step `step` from a one-step schedule (of `stages`, default all): micro-batch
    ids run across the whole run (mb + step * m) and the versions of F, B and U count steps (version + step)."""
    m, stages = schedule.m, range(schedule.d) if stages is None else stages
    return [
        [
            dataclasses.replace(
                a,
                mb=None if a.mb is None else a.mb + step * m,
                version=a.version + step if a.kind in VERSIONED else a.version,
            )
            for a in schedule.actions[s]
        ]
        for s in stages
    ]


def split_layers(model, d: int) -> list[range]:
    """Contiguous layer ranges of the d stages, balanced by parameter count."""
    costs = [sum(p.numel() for _, p in model.layer_named_parameters(i)) for i in range(model.num_layers)]
    return partition(costs, d)


class PipelineMethod(Method):
    """Shared base: partition the layers into d stages, run one schedule step per step()."""

    schedule_name: ClassVar[str] = ""
    precisions = ("fp32",)
    # Every stage of every replica needs the whole minibatch (a stage builds each micro-batch's
    # context, labels and dropout keys itself); the method cuts the replicas' shards.
    shards_batch: ClassVar[bool] = False
    # What `suite check` should launch under torchrun when world_size(run) > 1.
    dist_check_module: ClassVar[str] = "methods.pipeline.executors.dist_check"
    # Weight versions each stage holds: 1 for flush schedules, 2 for 2BW's double buffer.
    stage_versions: ClassVar[int] = 1
    # Flush schedules: weights and optimizer state exist when built, the rest is made anew in every step.
    steady_after: ClassVar[int] = 0
    # Steps of the schedule validated at start-up (2BW: enough to contain every distinct window).
    schedule_steps: ClassVar[int] = 1

    @classmethod
    def world_size(cls, run) -> int:
        o = cls.resolved_options(run)
        return o["stages"] * o["width"] if o["executor"] == "dist" else 1

    @classmethod
    def counted_ranks(cls, run) -> list[int]:
        """Replica 0 of the first stage of each kind: the first, the last, and per distinct set of middle layers
        the earliest. A later stage with the same layers holds no more: in every schedule here it stashes no
        more micro-batches (GPipe all m, 1F1B and 2BW d - stage), so the worst rank is among these."""
        from suite.core.check import build_model

        o = cls.resolved_options(run)
        d = o["stages"]
        with torch.device("meta"):  # sizes only: no bytes, no init worth the time
            model = build_model(run.model, run.seed)
        sizes = [sum(p.numel() for _, p in model.layer_named_parameters(i)) for i in range(model.num_layers)]
        first_of: dict[tuple, int] = {}
        for s, layers in enumerate(split_layers(model, d)):
            first_of.setdefault((s == 0, s == d - 1, tuple(sizes[i] for i in layers)), s)
        return sorted(s * o["width"] for s in first_of.values())

    @classmethod
    def check_config(cls, run) -> None:
        super().check_config(run)
        o = cls.resolved_options(run)
        d, w, m, layers = o["stages"], o["width"], run.num_micro_batches, run.model.resolved().layers + 2
        if not run.model.pretrained and not 1 <= d <= layers:  # a pretrained folder's depth: the constructor's
            raise ConfigError(
                f"stages={d}: the model has {layers} layers (embeddings, blocks, head), choose 1..{layers}"
            )
        # Replicas split the micro-batches, not the samples of each: a stage replica then computes each
        # micro-batch exactly as grad_accum does, and only the order of summing them differs.
        if w < 1 or m % w:
            fits = [k for k in range(1, m + 1) if m % k == 0]
            other = f", or num_micro_batches={w * -(-m // w)}" if w >= 1 else ""
            raise ConfigError(
                f"width={w} must divide num_micro_batches={m} (each replica pipeline runs an equal share of the "
                f"micro-batches): choose width in {fits}{other}"
            )
        if run.ranks != 1:  # the rank count is stages x width; `ranks` is data parallelism, which width is
            raise ConfigError(f"ranks={run.ranks}: a pipeline takes its ranks from stages x width; keep ranks=1")

    def __init__(self, model, run, device):
        super().__init__(model, run, device)
        d, w = self.opts["stages"], self.opts["width"]
        if not 1 <= d <= model.num_layers:
            raise ConfigError(
                f"stages={d}: the model has {model.num_layers} layers (embeddings, blocks, head), "
                f"choose 1..{model.num_layers}"
            )
        type(self).check_config(run)  # width and ranks; the stage bound above is the built model's own
        self.d, self.w, self.m = d, w, run.num_micro_batches // w
        self.ranges = split_layers(model, d)
        self.schedule = GENERATORS[self.schedule_name](d, self.m, self.schedule_steps)
        self.report = validate(self.schedule)  # a malformed schedule fails before any process waits
        self.step_count = 0
        recompute, clip = self.opts["recompute"], run.clip_grad_norm
        if self.opts["executor"] == "reference":
            self.replicas = list(range(w))
            self.stages = [
                Stage(model, r, s, device, recompute, run, self.stage_versions) for s, r in enumerate(self.ranges)
            ]
            self.executor = ReferenceExecutor(self.stages, w, clip)
        else:
            from methods.pipeline.executors.dist import DistExecutor, init_distributed

            rank, world = init_distributed(device, self.opts["timeout"])
            if world != d * w:
                raise ConfigError(f"stages={d} x width={w} needs {d * w} ranks, torchrun started {world}")
            s, r = divmod(rank, w)
            for i in set(range(model.num_layers)) - set(self.ranges[s]):
                drop(model.layers[i])  # other stages' weights: not this rank's to hold
            self.replicas = [r]
            self.stages = [Stage(model, self.ranges[s], s, device, recompute, run, self.stage_versions)]
            self.executor = DistExecutor(
                self.stages[0], d, w, device, self.opts["timeout"], clip, self.opts["timeline"]
            )

    @property
    def distributed(self) -> bool:
        return self.opts["executor"] == "dist"

    def _contexts(self, batch: MiniBatch) -> dict[int, dict]:
        """Per replica: global micro-batch id -> LayerContext (keys: seed, step, sample offset)."""
        out = {}
        for r in self.replicas:
            shard = batch.shard(r, self.w) if self.w > 1 else batch
            base = self.step_count * self.m
            out[r] = {
                base + j: self.model.begin(
                    mb.to(self.device, non_blocking=True), self.run.seed, self.step_count, batch.size
                )
                for j, mb in enumerate(shard.split(self.m))
            }
        return out

    def _run(self, batch: MiniBatch, update: bool) -> float:
        ctxs = self._contexts(batch)
        if self.distributed:
            s, r = self.stages[0].index, self.replicas[0]
            return self.executor.run(step_actions(self.schedule, self.step_count, [s])[0], ctxs[r], update)
        actions = step_actions(self.schedule, self.step_count)
        return self.executor.run(actions, [ctxs[r] for r in self.replicas], update)

    def step(self, batch: MiniBatch) -> StepStats:
        loss = self._run(batch, update=True)
        self.step_count += 1
        return StepStats(loss=loss, samples=batch.size)

    def gradients(self, batch: MiniBatch) -> float:
        """The step's schedule without OPTIMIZER_STEP: gradients stay in .grad, weights and step
        count unchanged (for comparing gradients with another implementation). Returns the loss."""
        return self._run(batch, update=False)

    def stash_peaks(self) -> list[int]:
        """Measured peak stash per stage (collective under the dist executor)."""
        if not self.distributed:
            return self.executor.peaks()
        peaks = [0] * self.d
        for info in self.executor.gather():
            peaks[info["stage"]] = max(peaks[info["stage"]], info["peak"])
        return peaks

    def timeline_records(self) -> list[dict]:
        """Start/end of every action of the last step on every rank (collective under dist)."""
        if not self.distributed:
            return list(self.executor.records)
        return [rec for info in self.executor.gather() for rec in info["records"]]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """FP32 weights by HF name on CPU; under dist gathered from replica 0 of every stage to every rank."""
        if not self.distributed:
            return {k: v for st in self.stages for k, v in st.state_dict().items()}
        mine = self.stages[0].state_dict() if self.replicas[0] == 0 else {}
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, (self.stages[0].index, mine))
        return {k: v for _, part in sorted(every, key=lambda x: x[0]) for k, v in part.items()}

    def resident_device_bytes(self) -> int:
        return sum(st.resident_bytes() for st in self.stages)

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        roles = [st.memory_roles() for st in self.stages]
        return {k: [t for r in roles for t in r[k]] for k in ("parameters", "gradients", "optimizer", "stash")}
