"""The 16-bit oracle catches one skipped update at any step (docs/oracle.md): AMP and L2L-CMP, bf16 and fp16, each
with its optimizer's update left out at one step, fail the check against FP32 AG; unchanged, they pass it."""

import pytest

from suite.config.run import RunConfig
from suite.core import registry
from suite.core.check import STEP_TOLERANCE, check

STEPS = 4
assert 1.0 > max(STEP_TOLERANCE.values())  # a skipped update fails the bound


def _skipping(base: str):
    """`base` whose optimizer applies nothing at step `skip_at` (its gradients made, its loss reported, no update:
    as a method that drops one step's update would)."""
    cls = registry.get(base)

    class Skips(cls):
        options = {**cls.options, "skip_at": registry.Option(0)}

        def __init__(self, model, run, device):
            super().__init__(model, run, device)
            opt = self.server.opt if hasattr(self, "server") else self.opt
            step, step_layer, at = opt.step, opt.step_layer, self.opts["skip_at"]
            opt.step = lambda s: None if s == at else step(s)
            opt.step_layer = lambda i, s: None if s == at else step_layer(i, s)

    name = f"{base}-skips-a-step"
    registry.unregister(name)
    registry.register(name)(Skips)
    return name


@pytest.mark.parametrize(
    "base, precision",
    [
        ("amp", "bf16"),
        ("l2l-cmp", "fp16"),
        pytest.param("amp", "fp16", marks=pytest.mark.slow),  # make test-slow: the two others cover both methods
        pytest.param("l2l-cmp", "bf16", marks=pytest.mark.slow),  # and both precisions in make test
    ],
)
def test_one_skipped_update_fails_the_check_at_every_step(base, precision):
    run = RunConfig(method=base, precision=precision, micro_batch_size=2, num_micro_batches=2)
    honest = check(run, "grad_accum", STEPS)
    assert honest.passed, honest.report(top=3)
    name = _skipping(base)
    try:
        for at in range(STEPS):
            skips = RunConfig(**{**run.__dict__, "method": name, "options": {"skip_at": at}})
            result = check(skips, "grad_accum", STEPS)
            assert not result.passed, (at, result.report(top=3))
            # its own update is 0: an error of exactly 1, past the bound, whatever the weights' errors at the end
            assert result.step_errors[at] == pytest.approx(1.0), result.report(top=3)
            assert max(result.step_errors[:at], default=0) <= STEP_TOLERANCE[precision]
    finally:
        registry.unregister(name)
