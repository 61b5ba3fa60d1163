"""The equivalence oracle: two methods from one seed, fed the same batches, compared tensor by tensor."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from suite.config.errors import ConfigError
from suite.config.run import RunConfig
from suite.core import registry
from suite.harness.data import synthetic_batches
from suite.harness.device import resolve_device
from suite.harness.model import build_model

# Norm-wise relative error of each tensor's update (W_N - W_0) allowed, by the lower precision compared.
# The update, not the weight: after a few steps at lr 1e-3 a weight barely moves, so weight-relative
# errors would hide a wrong update. 16-bit: Adam-type optimizers normalise each element, so bf16
# gradient rounding moves zero-initialised biases by up to 0.26 over 3 steps (measured on `tiny`,
# LAMB and AdamW, 7 seeds); 0.5 leaves a 2x margin, while a missing update gives 1 and a wrong-sign
# or stale one more.
TOLERANCE = {"fp32": 1e-5, "bf16": 0.5, "fp16": 0.5}
# In 16-bit precisions each step's update is compared too, the whole model's at once (every gated tensor as one
# vector): ||dW_k - dW_k(ref)|| / ||dW_k(ref)||. The per-tensor bound above lets one skipped step of several pass
# (it is a fraction of W_N - W_0); a skipped step's own update is 0, an error of exactly 1, at whatever step, and a
# wrong-signed one 2. Rounding moves it much less: an Adam-type update moves every element by about the LR whatever
# its gradient, so rounding shows as the elements whose gradient sign it flips, a fraction f giving about 2 sqrt(f).
# 0.5 allows f = 6%; measured on `tiny` (AMP and L2L-CMP against FP32 AG, 3 seeds, 6 steps): bf16's 8-bit
# significand 0.14 at worst (its first step, f about 0.5%), fp16's 11 bits 0.025 (f about 0.02%). docs/oracle.md.
STEP_TOLERANCE = {"bf16": 0.5, "fp16": 0.5}
# Each step's loss as the method reports it, against the reference's on the same batch: |l - l_ref| / |l_ref|. The
# weights are the same before each step and the batch is the same, so a loss differs only by the forward's rounding:
# FP32 methods gave the reference's loss bit for bit, bf16 within 6.2e-4 at worst and fp16 within 1.3e-5 (measured
# on `tiny`: AMP and L2L-CMP in bf16, AMP in fp16, L2L, GPipe and PipeDream-Flush in FP32, against FP32 AG, 3 seeds,
# 6 steps). The bounds: FP32's weight bound; in 16 bits the format's unit roundoff (2^-9 for bf16's 8-bit
# significand, 2^-12 for fp16's 11), about 3x and 19x the worst measured. A loss reported doubled, halved or of
# another micro-batch is off by far more (a factor of 2 is an error of 1).
LOSS_TOLERANCE = {"fp32": 1e-5, "bf16": 2**-9, "fp16": 2**-12}


def loss_error(a: float, b: float) -> float:
    """|a - b| / |b| of two reported losses; 0 where they are equal (NaN: never within a bound)."""
    if a == b:
        return 0.0
    return abs(a - b) / abs(b) if b != 0 and a == a and b == b else float("inf")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (Frobenius), with 0/0 = 0; norm-wise so single ill-conditioned elements do not dominate."""
    a, b = a.double(), b.double()
    num, den = (a - b).norm().item(), b.norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


@dataclass
class CheckResult:
    """Per-tensor relative errors of `method` against `against`, and the verdict."""

    method: str
    against: str
    steps: int
    tolerance: float
    errors: dict[str, float]
    weight_errors: dict[str, float]
    ungated: set[str]
    losses: list[tuple[float, float]]
    step_errors: list[float] = dataclasses.field(default_factory=list)  # each step's whole update (16-bit only)
    step_tolerance: float | None = None
    skipped: list[bool] = dataclasses.field(default_factory=list)  # the steps the method said it skipped
    loss_tolerance: float = 0.0  # each step's reported loss against the reference's (LOSS_TOLERANCE)

    @property
    def loss_errors(self) -> list[float]:
        return [loss_error(a, b) for a, b in self.losses]

    @property
    def worst_loss(self) -> tuple[int, float] | None:
        errors = self.loss_errors
        if not errors:
            return None
        k = max(range(len(errors)), key=errors.__getitem__)
        return k, errors[k]

    @property
    def worst_step(self) -> tuple[int, float] | None:
        if not self.step_errors:
            return None
        k = max(range(len(self.step_errors)), key=self.step_errors.__getitem__)
        return k, self.step_errors[k]

    @property
    def worst(self) -> tuple[str, float]:
        gated = {k: v for k, v in self.errors.items() if k not in self.ungated}
        k = max(gated, key=gated.get)
        return k, gated[k]

    @property
    def passed(self) -> bool:
        steps_ok = self.worst_step is None or self.worst_step[1] <= self.step_tolerance
        losses_ok = self.worst_loss is None or self.worst_loss[1] <= self.loss_tolerance
        return self.worst[1] <= self.tolerance and steps_ok and losses_ok

    def report(self, top: int = 0, verbose: bool = False) -> str:
        """The steps, then the tensors: every one with `verbose`, the `top` worst, else only those past the bound
        (none when it passed); the verdict last."""
        rows = sorted(self.errors.items(), key=lambda kv: -kv[1])
        if verbose:
            pass
        elif top:
            rows = rows[:top]
        else:
            rows = [(k, v) for k, v in rows if v > self.tolerance and k not in self.ungated]
        lines = [
            f"check {self.method} against {self.against}: {self.steps} steps, "
            f"tolerance {self.tolerance:g} (norm-wise relative error of each tensor's update W_N - W_0; "
            f"weight-relative error beside it); each step's loss within {self.loss_tolerance:g} of the reference's"
        ]
        if self.step_errors:
            lines.append(
                f"  each step's update, the whole model's at once, within {self.step_tolerance:g} of the reference's"
            )
        for i, (la, lb) in enumerate(self.losses):
            update = f"; update error {self.step_errors[i]:.3e}" if i < len(self.step_errors) else ""
            said = " (skipped, as the method said)" if i < len(self.skipped) and self.skipped[i] else ""
            lines.append(f"  step {i}: loss {la:.8f} vs {lb:.8f} ({loss_error(la, lb):.1e}){update}{said}")
        if rows:
            lines.append(f"  {'update err':>10}  {'weight err':>10}  tensor")
        for name, err in rows:
            tag = "  (not gated: zero gradient in exact arithmetic)" if name in self.ungated else ""
            lines.append(f"  {err:10.3e}  {self.weight_errors[name]:10.3e}  {name}{tag}")
        if len(rows) < len(self.errors):
            more = "more " if rows else ""
            lines.append(f"  ({len(self.errors) - len(rows)} {more}tensors within the bound: --verbose lists each)")
        name, err = self.worst
        within = err <= self.tolerance
        verdict = f"largest {err:.3e} ({name}) {'<=' if within else '>'} {self.tolerance:g}"
        if self.worst_step is not None:
            k, e = self.worst_step
            bound = self.step_tolerance
            verdict += f"; step {k}'s update {e:.3e} {'<=' if e <= bound else '>'} {bound:g}"
        if self.worst_loss is not None:
            k, e = self.worst_loss
            verdict += f"; step {k}'s loss {e:.3e} {'<=' if e <= self.loss_tolerance else '>'} {self.loss_tolerance:g}"
        lines.append(f"{'PASS' if self.passed else 'FAIL'}: {verdict}")
        return "\n".join(lines)


def build_method(run: RunConfig, device: torch.device | None = None):
    """Instantiate the method of `run` on a freshly seeded model."""
    cls = registry.get(run.method)
    cls.check_config(run)  # the method's own constraints (precision, ranks), in one line
    device = device or resolve_device(run.device)
    return cls(build_model(run.model, run.seed), run, device)


def default_precision(method: str, device: torch.device) -> str:
    """fp32 when the method allows it, else fp16 on CUDA and bf16 on CPU."""
    allowed = registry.get(method).precisions
    if "fp32" in allowed:
        return "fp32"
    preferred = "fp16" if device.type == "cuda" else "bf16"
    return preferred if preferred in allowed else allowed[0]


def reference_precision(run: RunConfig, against: str) -> str:
    """The precision the reference runs in: the subject's where the reference has it, else the reference's default
    (FP32 where it has it). Two different 16-bit formats are never compared silently: refused, in one line."""
    allowed = registry.get(against).precisions
    if run.precision in allowed:
        return run.precision
    chosen = default_precision(against, resolve_device(run.device))
    if run.precision in STEP_TOLERANCE and chosen in STEP_TOLERANCE:
        raise ConfigError(
            f"check {run.method} in {run.precision} against {against}: {against} runs {', '.join(allowed)}, not "
            f"{run.precision}; comparing {run.precision} with {chosen} says nothing of either: give --set "
            f"precision={chosen}, or a reference that runs {run.precision} or fp32"
        )
    return chosen


def check(run: RunConfig, against: str, steps: int, padded: bool = True) -> CheckResult:
    """Run `run.method` and `against` for `steps` steps on identical batches; compare every weight."""
    run = run.validate()
    device = resolve_device(run.device)
    ref_run = dataclasses.replace(run, method=against, precision=reference_precision(run, against), options={})
    subject, reference = build_method(run, device), build_method(ref_run, device)
    w0 = reference.state_dict()
    losses, states, ref_states, skipped = [], [], [], []
    batches_a, batches_b = synthetic_batches(run, padded), synthetic_batches(ref_run, padded)
    every = per_step(run.precision, ref_run.precision)
    for i in range(steps):
        sa, sb = subject.step(next(batches_a)), reference.step(next(batches_b))
        losses.append((sa.loss, sb.loss))
        skipped.append(sa.skipped)
        if every or i == steps - 1:
            states.append(subject.state_dict())
            ref_states.append(reference.state_dict())
    label, ref_label = f"{run.method} ({run.precision})", f"{against} ({ref_run.precision})"
    return compare(run, label, ref_label, w0, states, reference, ref_states, losses, skipped)


def compare(
    run: RunConfig,
    label: str,
    against: str,
    w0: dict,
    states: list[dict],
    reference,
    ref_states: list[dict],
    losses: list,
    skipped: list[bool] = (),
) -> CheckResult:
    """`states`, the weights trained from `w0` under `run` (named `label`) after each step, against those of the
    `reference` (named `against`) after each of its steps: every tensor's update and weight at the end, at the
    tolerance of the lower of the two precisions; in 16-bit precisions each step's whole update too."""
    if not states or not ref_states:
        raise ValueError(f"check {label} against {against}: no step taken (give --steps 1 or more)")
    state, ref_state = states[-1], ref_states[-1]
    if state.keys() != ref_state.keys():
        missing, extra = sorted(ref_state.keys() - state.keys()), sorted(state.keys() - ref_state.keys())
        raise AssertionError(f"{label} state_dict keys differ from {against}: missing {missing[:5]}, extra {extra[:5]}")
    errors = {k: relative_error(state[k] - w0[k], ref_state[k] - w0[k]) for k in ref_state}
    weight_errors = {k: relative_error(state[k], ref_state[k]) for k in ref_state}
    tol = max(TOLERANCE[run.precision], TOLERANCE[reference.run.precision])
    ungated = reference.model.gradient_free()
    result = CheckResult(label, against, len(losses), tol, errors, weight_errors, ungated, losses)
    result.skipped = list(skipped)
    result.loss_tolerance = max(LOSS_TOLERANCE[run.precision], LOSS_TOLERANCE[reference.run.precision])
    lower = [p for p in (run.precision, reference.run.precision) if p in STEP_TOLERANCE]
    if lower:
        assert len(states) == len(ref_states) == len(losses), "a 16-bit check needs the weights after every step"
        gated = [k for k in ref_state if k not in ungated]
        result.step_tolerance = max(STEP_TOLERANCE[p] for p in lower)
        result.step_errors = step_errors(w0, states, ref_states, gated)
    return result


def per_step(*precisions: str) -> bool:
    """Whether a check between these precisions (the subject's, the reference's) compares each step's update (one
    is 16-bit) and so needs the weights after every step; an FP32 one needs only the end's (its per-tensor bound
    already sees one step). Reading the weights drains a method's pipeline (L2L's host updates, 2BW's stream), so
    none is read where it is not compared."""
    return any(p in STEP_TOLERANCE for p in precisions)


def step_errors(w0: dict, states: list[dict], ref_states: list[dict], keys: list[str]) -> list[float]:
    """Each step's update, every tensor in `keys` as one vector, against the reference's (relative_error)."""

    def flat(state: dict) -> torch.Tensor:
        return torch.cat([state[k].double().flatten() for k in keys])

    out, before, ref_before = [], flat(w0), flat(w0)
    for state, ref_state in zip(states, ref_states):
        now, ref_now = flat(state), flat(ref_state)
        out.append(relative_error(now - before, ref_now - ref_before))
        before, ref_before = now, ref_now
    return out


def rank_check_parser(description: str, **method) -> argparse.ArgumentParser:
    """The options `suite check` passes a method's multi-rank check: --method (as `method` describes it to
    argparse), --against, --steps and --set."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--method", **method)
    p.add_argument("--against", default="grad_accum")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return p


def verdict_across_ranks(
    subject, label: str, w0: dict, states: list[dict], reference, ref_states: list[dict], losses: list, notes=()
) -> bool:
    """The end of a multi-rank check, called on every rank. Rank 0, the one holding the trained `reference` (None
    on the others) and its weights after each step (`ref_states`), compares `states`, the weights `subject` trained
    from `w0` after each step, with them and prints the report, then each note's line; `notes` are (line, holds)
    pairs of the method's own checks. True on every rank when the comparison passed and every note holds on every
    rank (the verdicts all-reduced)."""
    ok = all(holds for _, holds in notes)
    if reference is not None:
        against = f"{reference.run.method} ({reference.run.precision}) on 1 rank"
        label = f"{label} ({subject.run.precision})"
        result = compare(subject.run, label, against, w0, states, reference, ref_states, losses)
        print(result.report(top=5))
        for line, _ in notes:
            print(line)
        ok = ok and result.passed
    failed = torch.tensor([0.0 if ok else 1.0], device=subject.device)
    dist.all_reduce(failed)
    return failed.item() == 0
