"""The equivalence oracle: two methods from one seed, fed the same batches, compared tensor by tensor."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

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

    @property
    def worst(self) -> tuple[str, float]:
        gated = {k: v for k, v in self.errors.items() if k not in self.ungated}
        k = max(gated, key=gated.get)
        return k, gated[k]

    @property
    def passed(self) -> bool:
        return self.worst[1] <= self.tolerance

    def report(self, top: int = 0) -> str:
        rows = sorted(self.errors.items(), key=lambda kv: -kv[1])
        rows = rows[:top] if top else rows
        lines = [
            f"check {self.method} against {self.against}: {self.steps} steps, "
            f"tolerance {self.tolerance:g} (norm-wise relative error of each tensor's update W_N - W_0; "
            "weight-relative error beside it)"
        ]
        for i, (la, lb) in enumerate(self.losses):
            lines.append(f"  step {i}: loss {la:.8f} vs {lb:.8f}")
        for name, err in rows:
            tag = "  (not gated: zero gradient in exact arithmetic)" if name in self.ungated else ""
            lines.append(f"  {err:10.3e}  {self.weight_errors[name]:10.3e}  {name}{tag}")
        name, err = self.worst
        lines.append(
            f"{'PASS' if self.passed else 'FAIL'}: largest {err:.3e} ({name}) "
            f"{'<=' if self.passed else '>'} {self.tolerance:g}"
        )
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


def check(run: RunConfig, against: str, steps: int, padded: bool = True) -> CheckResult:
    """Run `run.method` and `against` for `steps` steps on identical batches; compare every weight."""
    run = run.validate()
    device = resolve_device(run.device)
    ref_run = dataclasses.replace(run, method=against, precision=default_precision(against, device), options={})
    subject, reference = build_method(run, device), build_method(ref_run, device)
    w0 = reference.state_dict()
    losses = []
    batches_a, batches_b = synthetic_batches(run, padded), synthetic_batches(ref_run, padded)
    for _ in range(steps):
        sa, sb = subject.step(next(batches_a)), reference.step(next(batches_b))
        losses.append((sa.loss, sb.loss))
    return compare(run, run.method, against, w0, subject.state_dict(), reference, losses)


def compare(run: RunConfig, label: str, against: str, w0: dict, state: dict, reference, losses: list) -> CheckResult:
    """`state`, the weights trained from `w0` under `run` (named `label`), against those of the trained `reference`
    (named `against`): every tensor's update and weight, at the tolerance of the lower of the two precisions."""
    ref_state = reference.state_dict()
    if state.keys() != ref_state.keys():
        missing, extra = sorted(ref_state.keys() - state.keys()), sorted(state.keys() - ref_state.keys())
        raise AssertionError(f"{label} state_dict keys differ from {against}: missing {missing[:5]}, extra {extra[:5]}")
    errors = {k: relative_error(state[k] - w0[k], ref_state[k] - w0[k]) for k in ref_state}
    weight_errors = {k: relative_error(state[k], ref_state[k]) for k in ref_state}
    tol = max(TOLERANCE[run.precision], TOLERANCE[reference.run.precision])
    ungated = reference.model.gradient_free()
    return CheckResult(label, against, len(losses), tol, errors, weight_errors, ungated, losses)


def rank_check_parser(description: str, **method) -> argparse.ArgumentParser:
    """The options `suite check` passes a method's multi-rank check: --method (as `method` describes it to
    argparse), --against, --steps and --set."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--method", **method)
    p.add_argument("--against", default="grad_accum")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    return p


def verdict_across_ranks(subject, label: str, w0: dict, state: dict, reference, losses: list, notes=()) -> bool:
    """The end of a multi-rank check, called on every rank. Rank 0, the one holding the trained `reference` (None
    on the others), compares `state`, the weights `subject` trained from `w0`, with it and prints the report, then
    each note's line; `notes` are (line, holds) pairs of the method's own checks. True on every rank when the
    comparison passed and every note holds on every rank (the verdicts all-reduced)."""
    ok = all(holds for _, holds in notes)
    if reference is not None:
        result = compare(subject.run, label, f"{reference.run.method} on 1 rank", w0, state, reference, losses)
        print(result.report(top=5))
        for line, _ in notes:
            print(line)
        ok = ok and result.passed
    failed = torch.tensor([0.0 if ok else 1.0], device=subject.device)
    dist.all_reduce(failed)
    return failed.item() == 0
