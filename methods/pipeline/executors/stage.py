"""One pipeline stage: a contiguous run of LayeredModel layers, its activation stash, its optimizer."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch

from suite.harness.device import place
from suite.harness.model import LayerContext, LayeredModel
from suite.harness.optim import LayerwiseOptimizer


class Stage:
    """Layers `layers` of `model` on `device`, run one micro-batch at a time.

    A forward stashes, per key (replica, micro-batch), the stage input and the context; without
    recompute also the output with its autograd graph. With recompute the forward runs without a
    graph and the backward rebuilds it from the stashed input: the layers draw their dropout masks
    from keys (seed, step, layer, sample), so the rebuilt graph is the original one.

    versions=2 (2BW) double-buffers the weights: `weights[v]` holds, per parameter, a leaf tensor of
    version v, for the latest version (sharing the parameter's storage) and for the shadow (the
    previous version's storage: a copy of the weights only, the optimizer state is not copied).
    F/B of a micro-batch run on the tensors of the version its action carries; their gradients
    gather in those leaves and move to the parameters at ALL_REDUCE (collect_grads).
    """

    def __init__(
        self,
        model: LayeredModel,
        layers: range,
        index: int,
        device: torch.device,
        recompute: bool,
        run=None,
        versions: int = 1,
    ):
        self.model, self.layers, self.index = model, layers, index
        self.first, self.last = layers.start == 0, layers.stop == model.num_layers
        self.device, self.recompute = device, recompute
        for i in layers:
            place(model.layers[i], device)
        self.named = [model.layer_named_parameters(i) for i in layers]
        self.params = [p for named in self.named for _, p in named]
        # One optimizer per stage object; the reference executor's replicas share the object.
        self.opt = LayerwiseOptimizer(self.named, run) if run is not None else None
        self.stash: dict[tuple[int, int], tuple] = {}
        self.live: Counter = Counter()  # stashed micro-batches per replica
        self.peak: Counter = Counter()
        self.version = 0  # optimizer steps taken: the weight version this stage holds
        self.loss = torch.zeros((), device=device)
        self.double_buffered = versions == 2
        # Every (module, name) slot holding one of self.params, tied slots included.
        index = {id(p): j for j, p in enumerate(self.params)}
        self.slots = [
            (mod, name, index[id(p)])
            for i in layers
            for mod in model.layers[i].modules(remove_duplicate=False)
            for name, p in mod._parameters.items()
            if p is not None and id(p) in index
        ]
        self.weights: dict[int, list[torch.Tensor]] = {0: self._leaves()} if self.double_buffered else {}

    def _leaves(self) -> list[torch.Tensor]:
        # `.data` shares the storage but not the version counter, so autograd graphs built on a
        # version are not invalidated when the parameter moves on (update() re-homes it first).
        return [p.data.requires_grad_(p.requires_grad) for p in self.params]

    @contextmanager
    def using(self, version: int | None):
        """Run the layers on weight version `version` (a no-op for single-version stages)."""
        if not self.double_buffered or version is None:
            yield
            return
        tensors = self.weights[version]
        for mod, name, j in self.slots:
            mod._parameters[name] = tensors[j]
        try:
            yield
        finally:
            for mod, name, j in self.slots:
                mod._parameters[name] = self.params[j]

    def boundary_shape(self, ctx: LayerContext) -> tuple[int, ...]:
        """Shape of the activation entering this stage (and of the gradient it sends back)."""
        return (ctx.mb.size, ctx.mb.input_ids.shape[1], self.model.cfg.hidden)

    def run_layers(self, x, ctx: LayerContext):
        for i in self.layers:
            x = self.model.forward_layer(i, x, ctx)
        return x

    def forward(self, key: tuple[int, int], x, ctx: LayerContext, version: int | None = None) -> torch.Tensor:
        """Run the stage on `x` (the MicroBatch on the first stage, else the received activation);
        returns the output detached from the graph (what is sent on) or, on the last stage, the loss."""
        if not self.first:
            x = x.detach().requires_grad_(True)  # a leaf, so backward leaves its gradient in x.grad
        with torch.set_grad_enabled(not self.recompute), self.using(version):
            out = self.run_layers(x, ctx)
        if self.last:
            self.loss += out.detach()
            # A step keeps every micro-batch's context; the head's logits there (read only by evaluation)
            # would hold batch x seq x vocab per micro-batch until the step ends.
            ctx.logits = None
        if key in self.stash:
            raise RuntimeError(f"stage {self.index}: micro-batch {key} forwarded twice")
        self.stash[key] = (x, ctx, None if self.recompute else out, version)
        r = key[0]
        self.live[r] += 1
        self.peak[r] = max(self.peak[r], self.live[r])
        return out.detach()

    def backward(self, key: tuple[int, int], grad: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of micro-batch `key` given the gradient of its output (None on the last stage,
        whose output is the loss); accumulates weight gradients, returns the input's gradient."""
        if key not in self.stash:
            raise RuntimeError(f"stage {self.index}: backward of micro-batch {key} without its forward")
        x, ctx, out, version = self.stash.pop(key)
        self.live[key[0]] -= 1
        if out is None:
            with torch.enable_grad(), self.using(version):
                out = self.run_layers(x, ctx)
            ctx.logits = None
        torch.autograd.backward(out, None if self.last else grad)
        return None if self.first else x.grad

    def grad_sq_norm(self) -> torch.Tensor:
        """Sum over this stage's gradients of their squared norms (for a global clip norm)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        return torch.stack(torch._foreach_norm(grads)).square().sum()

    def scale_grads(self, coef: torch.Tensor) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef)

    def collect_grads(self) -> None:
        """2BW: move the gradients gathered in the version leaves onto the parameters, where the
        all-reduce, the clip norm and the optimizer find them (a no-op for single-version stages)."""
        for j, p in enumerate(self.params):
            for leaves in self.weights.values():
                g, leaves[j].grad = leaves[j].grad, None
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g

    def update(self, step: int) -> None:
        """Optimizer step number `step` (0-indexed) on every layer of the stage; gradients dropped.
        2BW: the latest version becomes the shadow and the one before it is discarded."""
        if self.double_buffered:
            # No later micro-batch uses the version before the latest (paper §3.1). It leaves self.weights only
            # once re-homed below, so that a count still names its buffers as weights during the update.
            dead = self.weights.get(self.version - 1)
            for j, p in enumerate(self.params):
                # The shadow keeps the latest storage; the new version is stepped in the dead version's
                # buffer, so a stage allocates its second weight buffer once (at the first update), never again.
                if dead is None:
                    p.data = p.data.clone()
                else:
                    p.data = dead[j].data.copy_(p.data)
            self.weights.pop(self.version - 1, None)
        for j in range(len(self.named)):
            self.opt.step_layer(j, step)
        self.zero_grad()
        self.version += 1
        if self.double_buffered:
            self.weights[self.version] = self._leaves()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def check_version(self, action) -> None:
        """Flush schedules run every F/B of a step on the weights it started with; a schedule asking
        for another version (2BW) needs weight stashing, which only double-buffered stages keep."""
        if self.double_buffered:
            if action.version not in self.weights:
                raise RuntimeError(
                    f"stage {self.index}: {action.token} wants weight version {action.version} "
                    f"but the stage holds versions {sorted(self.weights)}"
                )
        elif action.version != self.version:
            raise RuntimeError(
                f"stage {self.index}: {action.token} wants weight version {action.version} "
                f"but the stage holds version {self.version} (flush executors keep one version)"
            )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().cpu().clone() for named in self.named for n, p in named}

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        """This stage's tensors by role, for a count: weights (every version), gradients, optimizer state and
        the stashed inputs and outputs of micro-batches awaiting their backward."""
        versions = [t for ts in self.weights.values() for t in ts]
        grads = [t.grad for t in [*self.params, *versions] if t.grad is not None]
        stashed = [t for x, _, out, _ in self.stash.values() for t in (x, out) if isinstance(t, torch.Tensor)]
        state = self.opt.state_tensors() if self.opt is not None else []
        return {"parameters": self.params + versions, "gradients": grads, "optimizer": state, "stash": stashed}

    def resident_bytes(self) -> int:
        state = self.opt.state_bytes() if self.opt is not None else 0
        shadow = sum(t.numel() * t.element_size() for v, ts in self.weights.items() if v != self.version for t in ts)
        return sum(p.numel() * p.element_size() for p in self.params) + state + shadow


def take(box: dict, kind, action) -> torch.Tensor:
    """The tensor `kind` of action's micro-batch from an executor's in/out box; a clear error for a
    malformed action list (a send before its producer, a compute before its receive)."""
    try:
        return box.pop((kind, action.mb))
    except KeyError:
        raise RuntimeError(
            f"stage {action.stage}: {action.token} needs the {kind} of micro-batch {action.mb}, "
            "which no earlier action produced (malformed action list)"
        ) from None


def clip_coefficient(sq_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor from the global squared norm: min(1, max / (norm + 1e-6))."""
    return torch.clamp(max_norm / (sq_norm.sqrt() + 1e-6), max=1.0)
