"""torch.distributed interpreter of a Schedule: one rank per stage replica, batched non-blocking p2p."""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from methods.pipeline.executors.stage import Stage, clip_coefficient, take
from methods.pipeline.schedules.schedule import (
    ALL_REDUCE,
    BACKWARD,
    COMM,
    FORWARD,
    OPTIMIZER_STEP,
    RECV_ACT,
    RECV_GRAD,
    SEND_ACT,
    SEND_GRAD,
    SENDS,
    Action,
)
from suite.config.errors import ConfigError
from suite.harness.device import scalar


def init_distributed(device: torch.device, timeout_s: float) -> tuple[int, int]:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA) with a bounded timeout."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise ConfigError(
                "executor=dist runs one process per stage replica: launch it with "
                "python -m torch.distributed.run --nproc_per_node=STAGES*WIDTH ..."
            )
        kwargs = dict(timeout=timedelta(seconds=timeout_s))
        if device.type == "cuda":
            torch.cuda.set_device(device)
            kwargs.update(backend="nccl", device_id=device)
        else:
            kwargs.update(backend="gloo")
        dist.init_process_group(**kwargs)
    return dist.get_rank(), dist.get_world_size()


def rank_main(fn) -> None:
    """Run `fn()` as a rank's entry point: on any failure print the rank's traceback and exit
    non-zero at once (no collective clean-up that could wait on a dead peer), so torchrun tears
    the other ranks down; otherwise exit with fn's return code, also at once: the verdict is in and
    the group left, and a rank was seen to abort in the interpreter's teardown ("terminate called
    without an active exception") after a passing check, on a loaded machine (as L2L's check does)."""
    try:
        code = fn()
    except BaseException as exc:  # noqa: BLE001 — a rank must never hang on its way out
        told = getattr(exc, "pipeline_reported", False)
        detail = f"{type(exc).__name__}: {exc}" if told else traceback.format_exc()
        print(f"[rank {os.environ.get('RANK', '?')}] failed: {detail}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


class DistExecutor:
    """Executes this rank's action list for stage `stage.index`, replica `replica` of `width`.

    Ranks are stage-major (rank = stage * width + replica) so that a stage's replicas are
    neighbours, which is where the paper places them for a cheap all-reduce. Runs of consecutive
    sends/receives go out as one batch_isend_irecv (1F1B's neighbours send to each other at the
    same time; NCCL) or as independent requests (gloo); receives are waited on before the compute
    that needs them, sends only when done or at the end of the step. Every wait has a timeout
    (gloo; NCCL's watchdog enforces the group's).
    """

    def __init__(
        self,
        stage: Stage,
        d: int,
        width: int,
        device: torch.device,
        timeout_s: float,
        clip_grad_norm: float = 0.0,
        sync_timing: bool = False,
    ):
        self.stage, self.d, self.width, self.device = stage, d, width, device
        self.rank = dist.get_rank()
        self.replica = self.rank % width
        self.timeout = timedelta(seconds=timeout_s)
        self.clip = clip_grad_norm
        self.sync_timing = sync_timing and device.type == "cuda"
        self.gloo = dist.get_backend() == "gloo"
        # new_group is collective over all ranks, in the same order everywhere.
        groups = [
            dist.new_group([s * width + r for r in range(width)], timeout=self.timeout) if width > 1 else None
            for s in range(d)
        ]
        self.stage_group = groups[stage.index]
        # One clock: perf_counter is system-wide on one host; across hosts align at a barrier.
        hosts: list = [socket.gethostname()] * dist.get_world_size()
        if dist.get_backend() != "fake":  # a counted rank's fake group moves no objects (suite.measure.counting)
            dist.all_gather_object(hosts, socket.gethostname())
        self._barrier()  # also the first collective, which NCCL wants every rank to join
        self.clock_offset = 0.0 if len(set(hosts)) == 1 else -time.perf_counter()
        self.records: list[dict] = []
        self.pending: list[tuple] = []

    def _barrier(self) -> None:
        self._wait(dist.barrier(async_op=True))

    def _wait(self, work) -> None:
        if self.gloo:
            work.wait(timeout=self.timeout)
        else:
            work.wait()  # orders the compute stream after the transfer

    def _now(self) -> float:
        if self.sync_timing:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() + self.clock_offset

    def _peer(self, a: Action) -> int:
        return a.peer * self.width + self.replica

    def run(self, actions: list[Action], contexts: dict, update: bool = True, carry: bool = False) -> float:
        """Execute this stage's actions of one step; contexts[mb] is the LayerContext of this
        replica's micro-batch mb. update=False skips OPTIMIZER_STEP. carry=True leaves unfinished
        sends pending for the next call (a 2BW window's gradient may be received in the next window,
        and a gloo send completes only once its receive is posted). Returns the minibatch loss."""
        acts = [a for a in actions if update or a.kind is not OPTIMIZER_STEP]
        self.records, self.box, self.at = [], {}, None
        self.stage.loss.zero_()
        try:
            i = 0
            while i < len(acts):
                a = self.at = acts[i]
                if a.kind in COMM:
                    j = i
                    while j < len(acts) and acts[j].kind in COMM:
                        j += 1
                    self._communicate(acts[i:j], contexts)
                    i = j
                    continue
                t0 = self._now()
                self._compute(a, contexts)
                self._record(a, t0)
                i += 1
            self.at = None
            if not carry:
                for work, _ in self.pending:
                    self._wait(work)
                self.pending = []
            loss = self.stage.loss.clone() if self.stage.last else torch.zeros((), device=self.device)
            self._wait(dist.all_reduce(loss, async_op=True))
            return scalar(loss)
        except BaseException as exc:
            where = f" at {self.at.token}" if self.at is not None else " at the end of the step"
            print(
                f"[pipeline rank {self.rank}, stage {self.stage.index}, replica {self.replica}] step "
                f"failed{where}:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
            exc.pipeline_reported = True  # rank_main need not print the traceback again
            raise

    @staticmethod
    def _tag(a: Action) -> int:
        # Tags name the micro-batch, so a mismatched pair times out instead of swapping data (gloo).
        return (a.mb % (1 << 20)) * 2 + (a.kind in (SEND_GRAD, RECV_GRAD))

    def _irecv(self, a: Action, contexts: dict):
        t = torch.empty(self.stage.boundary_shape(contexts[a.mb]), device=self.device)
        return dist.irecv(t, self._peer(a), tag=self._tag(a)), t

    def _communicate(self, batch: list[Action], contexts: dict) -> None:
        t0 = self._now()
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
        if self.gloo:  # independent requests: wait for the receives, let the sends finish alone
            # Receives are posted when the schedule reaches them, not ahead: posting ahead saves
            # gloo's ready-to-receive round trip (~0.5 ms measured under load) but makes its
            # transport thread copy the data while the rank computes, which cost ~10% step time
            # with one compute thread per core (2 ranks, 2 cores).
            recvs = []
            for a in batch:
                if a.kind in SENDS:
                    t = take(self.box, a.kind, a).contiguous()
                    self.pending.append((dist.isend(t, self._peer(a), tag=self._tag(a)), t))
                else:
                    recvs.append((a, *self._irecv(a, contexts)))
            for a, work, t in recvs:
                self.at = a
                self._wait(work)
                self.box[a.kind, a.mb] = t
        else:  # NCCL: one coalesced batch in schedule order (one stream per peer: keep the order)
            ops, recvs = [], []
            for a in batch:
                if a.kind in SENDS:
                    ops.append(
                        dist.P2POp(dist.isend, take(self.box, a.kind, a).contiguous(), self._peer(a), tag=self._tag(a))
                    )
                else:
                    t = torch.empty(self.stage.boundary_shape(contexts[a.mb]), device=self.device)
                    ops.append(dist.P2POp(dist.irecv, t, self._peer(a), tag=self._tag(a)))
                    recvs.append((a, t))
            for work in dist.batch_isend_irecv(ops):
                self._wait(work)  # only orders the compute stream after the transfers
            for a, t in recvs:
                self.box[a.kind, a.mb] = t
        for a in batch:
            self._record(a, t0)

    def _compute(self, a: Action, contexts: dict) -> None:
        st, key = self.stage, (self.replica, a.mb)
        if a.kind is FORWARD:
            st.check_version(a)
            ctx = contexts[a.mb]
            out = st.forward(key, ctx.mb if st.first else take(self.box, RECV_ACT, a), ctx, a.version)
            if not st.last:
                self.box[SEND_ACT, a.mb] = out
        elif a.kind is BACKWARD:
            st.check_version(a)
            grad = st.backward(key, None if st.last else take(self.box, RECV_GRAD, a))
            if not st.first:
                self.box[SEND_GRAD, a.mb] = grad
        elif a.kind is ALL_REDUCE:
            st.collect_grads()
            self._all_reduce_grads()
        elif a.kind is OPTIMIZER_STEP:
            if self.clip > 0:
                # Replicas hold equal gradients after ALL_REDUCE: count each stage once.
                sq = st.grad_sq_norm() if self.replica == 0 else torch.zeros((), device=self.device)
                self._wait(dist.all_reduce(sq, async_op=True))
                st.scale_grads(clip_coefficient(sq, self.clip))
            st.update(a.version - 1)
        else:
            raise ValueError(f"unknown action {a}")

    def _all_reduce_grads(self) -> None:
        if self.width == 1:
            return
        params = self.stage.params
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch._utils._flatten_dense_tensors([p.grad for p in params])
        self._wait(dist.all_reduce(flat, group=self.stage_group, async_op=True))
        for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, [p.grad for p in params])):
            p.grad.copy_(g)

    def _record(self, a: Action, t0: float) -> None:
        self.records.append(
            dict(
                rank=self.rank,
                replica=self.replica,
                stage=a.stage,
                kind=a.kind.value,
                mb=a.mb,
                version=a.version,
                peer=a.peer,
                start=t0,
                end=self._now(),
            )
        )

    def gather(self) -> list[dict]:
        """Every rank's peak stash and last-step records, on every rank (collective)."""
        mine = dict(
            rank=self.rank,
            stage=self.stage.index,
            replica=self.replica,
            peak=max(self.stage.peak.values(), default=0),
            records=self.records,
        )
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, mine)
        return out

    def replicas_identical(self) -> bool:
        """Whether every replica of this stage holds bitwise the same weights (collective)."""
        same = torch.ones((), device=self.device)
        if self.width > 1:
            flat = torch._utils._flatten_dense_tensors([p.detach() for p in self.stage.params])
            every = [torch.empty_like(flat) for _ in range(self.width)]
            dist.all_gather(every, flat, group=self.stage_group)
            same.fill_(float(all(torch.equal(flat, e) for e in every)))
        self._wait(dist.all_reduce(same, op=dist.ReduceOp.MIN, async_op=True))
        return bool(same.item())
