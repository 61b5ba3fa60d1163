"""Optimizers that can step one layer at a time: LAMB (the L2L paper's) and torch's AdamW, with an LR schedule."""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import nn

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch without distributed: no sharded tensors to refuse
    DTensor = ()

from suite.harness import fused_lamb
from suite.harness.adamw import fused_adamw, group_hyper
from suite.harness.device import is_fake

IMPLS = ("fused", "foreach")  # the optimizers' kernels: fused where the tensors allow, else torch's foreach ops
# Where a window of a step by step_window may start, from its parameter's start: a multiple of every CPU vector
# width (and of torch's 16-float task units), so that torch's fused AdamW gives each element the same bits.
WINDOW_ALIGN = 4096


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2019): Adam's direction with a per-tensor trust ratio ||w|| / ||update||.

    The reference is vectorised with torch._foreach ops and free of host syncs. With fused=True, a group of
    contiguous FP32 CPU tensors steps through the fused kernel instead (csrc/lamb.cpp: two passes per tensor,
    threaded, no temporary), within float rounding of the reference. It spends the gradients: they hold the
    updates afterwards (every method drops or overwrites them before the next backward).
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.0,
        bias_correction=True,
        fused=False,
        device_fused=False,
    ):
        if lr <= 0 or eps <= 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyper-parameters lr={lr}, betas={betas}, eps={eps}")
        super().__init__(
            params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        )
        self.fused = fused and fused_lamb.kernel() is not None
        self.device_fused = device_fused

    def _kernel(self, tensors: list[torch.Tensor]):
        """The fused kernel if asked for and every tensor can take it, else None (the foreach path)."""
        if not self.fused or not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
            return None
        # A sharded DTensor (FSDP2) holds a shard, and the trust ratio needs the whole tensor's norm.
        if not all(t.is_contiguous() and not isinstance(t, DTensor) for t in tensors):
            return None
        return fused_lamb.kernel()

    @staticmethod
    def fresh_state(p: torch.Tensor) -> dict:
        """A parameter's state before its first step."""
        return dict(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))

    def _groups(self):
        """(group, params, grads, m, v, c1, c2) of each group with gradients, its parameters' step counts advanced."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            for p in params:
                s = self.state[p]
                # Made lazily, or again when made before the weights were converted (model.double() after build).
                if not s or (s["step"] == 0 and (s["exp_avg"].dtype, s["exp_avg"].device) != (p.dtype, p.device)):
                    self.state[p] = self.fresh_state(p)
            states = [self.state[p] for p in params]
            for s in states:
                s["step"] += 1
            t = states[0]["step"]
            b1, b2 = group["betas"]
            c1, c2 = (1 - b1**t, 1 - b2**t) if group["bias_correction"] else (1.0, 1.0)
            yield group, params, grads, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], c1, c2

    # Where the device kernel runs: CUDA. The tests add "cpu", where Triton's interpreter runs it on CPU tensors.
    KERNEL_DEVICES = ("cuda",)

    def _on_device_kernel(self, tensors: list[torch.Tensor]) -> bool:
        """Whether these tensors step through the device's multi-tensor kernel (suite/harness/kernels/lamb_step):
        asked for (device_fused), and contiguous FP32 tensors on a KERNEL_DEVICES device, or a counted step's
        stand-ins for them. A sharded DTensor (FSDP2) holds a shard: the trust ratio needs the whole tensor."""
        if not self.device_fused or any(isinstance(t, DTensor) for t in tensors):
            return False
        if is_fake(tensors[0]):  # a counted step counts what a GPU's run allocates: it takes the kernel with triton
            return importlib.util.find_spec("triton") is not None
        if tensors[0].device.type not in self.KERNEL_DEVICES:
            return False
        from suite.harness.kernels import lamb_step, missing

        why = missing() or lamb_step.check(tensors)
        if why and tensors[0].device.type == "cuda":  # never a silent fallback on the GPU
            raise RuntimeError(f"the device LAMB kernel cannot step these tensors: {why}")
        return not why

    @torch.no_grad()
    def step(self, closure=None):
        step_all([self])

    def _step_group(self, group, params, grads, m, v, c1, c2) -> None:
        """One group through the host's fused kernel or torch's foreach ops."""
        b1, b2 = group["betas"]
        kernel = self._kernel([*params, *grads, *m, *v])
        if kernel is not None:
            if not is_fake(params[0]):  # a counted step: the kernel makes no tensor, there is nothing to count
                hyper = (group["lr"], b1, b2, group["eps"], group["weight_decay"], c1, c2)
                kernel.lamb_step(params, grads, m, v, *hyper)
                # It wrote through data pointers: tell autograd, as torch's own in-place ops do.
                for t in (*params, *grads, *m, *v):
                    torch.autograd.graph.increment_version(t)
            return
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(c2))
        torch._foreach_add_(denom, group["eps"])
        update = torch._foreach_div(m, denom)
        torch._foreach_div_(update, c1)
        if group["weight_decay"]:
            torch._foreach_add_(update, params, alpha=group["weight_decay"])
        w_norm = torch._foreach_norm(params)
        u_norm = torch._foreach_norm(update)
        trust = [torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) for w, u in zip(w_norm, u_norm)]
        torch._foreach_mul_(update, trust)
        torch._foreach_add_(params, update, alpha=-group["lr"])


@torch.no_grad()
def step_all(opts: list[Lamb]) -> None:
    """Step several LAMB optimizers (a model's layers) together: every group that takes the device's multi-tensor
    kernel in one call per set of hyper-parameters (three launches for the whole model), the rest group by group."""
    batches: dict[tuple, list] = {}
    for opt in opts:
        for group, params, grads, m, v, c1, c2 in opt._groups():
            if opt._on_device_kernel([*params, *grads, *m, *v]):
                b1, b2 = group["betas"]
                key = (params[0].device, group["lr"], b1, b2, group["eps"], c1, c2)  # one launch never spans devices
                lists = batches.setdefault(key, [[], [], [], [], []])
                for into, items in zip(lists, (params, grads, m, v, [group["weight_decay"]] * len(params))):
                    into.extend(items)
            else:
                opt._step_group(group, params, grads, m, v, c1, c2)
    if batches:
        from suite.harness.kernels import lamb_step

        layouts = opts[0].__dict__.setdefault("_layouts", {})
        for (_, lr, b1, b2, eps, c1, c2), (params, grads, m, v, wd) in batches.items():
            lamb_step.step(layouts, params, grads, m, v, wd, lr, b1, b2, eps, c1, c2)
            for t in (*params, *grads, *m, *v):  # written through addresses: tell autograd, as in-place ops do
                torch.autograd.graph.increment_version(t)


def no_decay(name: str) -> bool:
    """BERT convention: no weight decay on biases and LayerNorm weights."""
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def lr_at(run, step: int) -> float:
    """Learning rate at optimizer step `step` (0-indexed): constant, or linear warm-up then linear decay."""
    if run.schedule == "constant":
        return run.lr if step >= run.warmup_steps else run.lr * (step + 1) / run.warmup_steps
    total = max(run.total_steps, 1)
    if step < run.warmup_steps:
        return run.lr * (step + 1) / run.warmup_steps
    return run.lr * max(0.0, (total - step) / max(total - run.warmup_steps, 1))


class LayerwiseOptimizer:
    """One optimizer per layer so that a layer can be stepped alone (L2L's host param server does).

    impl="fused" steps CPU tensors through fused kernels (torch's fused AdamW, the suite's fused LAMB), which
    every method on a CPU shares so that their equivalence stays bitwise; elsewhere (CUDA) torch's foreach ops.
    A counted step's fake CPU tensors stand for the device's, so they take the device's foreach path, unless
    `host` says they are the host's (L2L's param server).
    """

    def __init__(self, layers: list[list[tuple[str, nn.Parameter]]], run, impl: str = "fused", host: bool = False):
        if impl not in IMPLS:
            raise ValueError(f"optimizer impl={impl!r} is not one of {list(IMPLS)}")
        self.run, self.impl, self.host = run, impl, host
        self.opts = [self._make([(n, p) for n, p in named if p.requires_grad]) for named in layers]
        self._preallocate()

    def _fused(self, params: list[nn.Parameter]) -> bool:
        if self.impl != "fused" or not all(p.device.type == "cpu" for p in params):
            return False
        return self.host or not any(is_fake(p) for p in params)

    def _preallocate(self) -> None:
        """Create each optimizer's per-parameter state now, in the form its step() would create lazily, so that
        no step allocates state: a method's memory is steady from its first step (a count needs no warm-up)."""
        for o in self.opts:
            if o is None:
                continue
            for group in o.param_groups:
                for p in group["params"]:
                    if isinstance(o, Lamb):
                        o.state[p] = Lamb.fresh_state(p)
                    elif isinstance(o, torch.optim.AdamW) and not group["capturable"]:
                        # torch keeps the step count as a 0-d tensor: on the parameter's device when fused, as FP32.
                        fused = group["fused"]
                        step = torch.zeros((), dtype=torch.float32, device=p.device) if fused else torch.tensor(0.0)
                        o.state[p] = dict(step=step, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                        if group["amsgrad"]:
                            o.state[p]["max_exp_avg_sq"] = torch.zeros_like(p)

    def _make(self, named):
        decay = [p for n, p in named if not no_decay(n)]
        plain = [p for n, p in named if no_decay(n)]
        groups = [
            g
            for g in (dict(params=decay, weight_decay=self.run.weight_decay), dict(params=plain, weight_decay=0.0))
            if g["params"]
        ]
        if not groups:
            return None
        betas = (self.run.beta1, self.run.beta2)
        fused = self._fused([p for _, p in named])
        if self.run.optimizer == "lamb":
            # On the device (not L2L's host server): every layer's LAMB through one multi-tensor kernel (step()).
            device = self.impl == "fused" and not self.host
            return Lamb(groups, lr=self.run.lr, betas=betas, eps=self.run.eps, fused=fused, device_fused=device)
        if fused:
            return torch.optim.AdamW(groups, lr=self.run.lr, betas=betas, eps=self.run.eps, fused=True)
        return torch.optim.AdamW(groups, lr=self.run.lr, betas=betas, eps=self.run.eps, foreach=True)

    def step_layer(self, index: int, step: int) -> None:
        """Apply optimizer step number `step` (0-indexed, sets the scheduled LR) to one layer."""
        opt = self.opts[index]
        if opt is None:
            return
        self._set_lr(opt, step)
        opt.step()

    def _set_lr(self, opt, step: int) -> None:
        lr = lr_at(self.run, step)
        for g in opt.param_groups:
            g["lr"] = lr

    def windowable(self, index: int) -> bool:
        """Whether layer `index` can step window by window (begin_windows, step_window): torch's fused AdamW, whose
        update is elementwise."""
        opt = self.opts[index]
        return opt is None or (
            isinstance(opt, torch.optim.AdamW) and all(g["fused"] and not g["amsgrad"] for g in opt.param_groups)
        )

    def begin_windows(self, index: int, step: int) -> None:
        """Start optimizer step `step` of layer `index` window by window: set its LR and advance its step counts, as
        AdamW's step() does before its one fused call over the layer."""
        opt = self.opts[index]
        if opt is None:
            return
        self._set_lr(opt, step)
        torch._foreach_add_([opt.state[p]["step"] for g in opt.param_groups for p in g["params"]], 1)

    @torch.no_grad()
    def step_window(self, index: int, pieces: list[tuple[nn.Parameter, int, int, torch.Tensor]]) -> None:
        """Part of the step begun by begin_windows: for each (param, start, stop, grad), the elements start:stop of
        the flattened param (and of its moments) updated with `grad`, an FP32 tensor of stop - start elements.

        torch's fused AdamW computes each element alone, its vector loop running from each tensor's start, so where
        every start is a multiple of WINDOW_ALIGN from its parameter's start, each element gets the bits one call
        over the whole layer gives it (tests/l2l/test_l2l_host_bytes.py checks it, and that an unaligned start
        does not)."""
        opt = self.opts[index]
        for g in opt.param_groups if opt is not None else ():
            mine = {id(p) for p in g["params"]}
            part = [(p, a, b, grad) for p, a, b, grad in pieces if id(p) in mine]
            if not part:
                continue
            state = [opt.state[p] for p, *_ in part]
            fused_adamw(
                [p.detach().view(-1)[a:b] for p, a, b, _ in part],
                [grad for *_, grad in part],
                [s["exp_avg"].view(-1)[a:b] for s, (_, a, b, _) in zip(state, part)],
                [s["exp_avg_sq"].view(-1)[a:b] for s, (_, a, b, _) in zip(state, part)],
                [s["step"] for s in state],
                **group_hyper(g),
            )

    @torch.no_grad()
    def step_16bit(self, index: int, step: int, module, halves: dict, grad_mul: float, threads: int) -> None:
        """Optimizer step `step` of layer `index` (a windowable one) from 16-bit gradients in one pass, writing the
        parameters' 16-bit copies: `halves` maps each parameter's id to (its bf16 gradient, its bf16 copy), `module`
        the one-pass kernel (suite.harness.host_commit), its gradients multiplied by `grad_mul` first. The bits of
        a widening copy, step_window over the whole layer and a rounding copy."""
        from suite.harness.host_commit import step_16bit

        opt = self.opts[index]
        if opt is None:
            return
        self.begin_windows(index, step)
        params = [p for g in opt.param_groups for p in g["params"]]
        decays = [g["weight_decay"] for g in opt.param_groups for _ in g["params"]]
        g0 = opt.param_groups[0]
        state = [opt.state[p] for p in params]
        step_16bit(
            module,
            [p.detach() for p in params],
            [halves[id(p)][0] for p in params],
            [s["exp_avg"] for s in state],
            [s["exp_avg_sq"] for s in state],
            [halves[id(p)][1] for p in params],
            decays,
            lr=g0["lr"],
            beta1=g0["betas"][0],
            beta2=g0["betas"][1],
            eps=g0["eps"],
            step=state[0]["step"],
            grad_mul=grad_mul,
            threads=threads,
        )

    def step(self, step: int) -> None:
        """Step every layer: LAMB's layers together (one multi-tensor pass on the device), AdamW's layer by layer."""
        lamb = [o for o in self.opts if isinstance(o, Lamb)]
        if not lamb:
            for i in range(len(self.opts)):
                self.step_layer(i, step)
            return
        lr = lr_at(self.run, step)
        for o in lamb:
            for g in o.param_groups:
                g["lr"] = lr
        step_all(lamb)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every optimizer state tensor, layer by layer."""
        return [
            t for o in self.opts if o is not None for s in o.state.values() for t in s.values() if torch.is_tensor(t)
        ]

    def state_bytes(self) -> int:
        """Bytes held by the optimizer states (for memory accounting)."""
        return sum(t.numel() * t.element_size() for t in self.state_tensors())
