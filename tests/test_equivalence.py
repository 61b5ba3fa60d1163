"""AG with m micro-batches equals one big batch; AMP stays within the 16-bit tolerance of FP32."""

import dataclasses

import pytest
import torch

from suite.config.run import RunConfig
from suite.core.check import TOLERANCE, build_method, check, relative_error
from suite.harness.data import synthetic_batches


def _grads_after_one_step(run):
    method = build_method(run, torch.device("cpu"))
    batch = next(synthetic_batches(run, padded=True))
    method.opt.step = lambda step: None  # keep the gradients of the first step, skip the update
    method.step(batch)
    return {n: p.grad.detach().clone() for named in method.layer_params for n, p in named}, method


@pytest.mark.parametrize("m", [2, 4, 8])
def test_micro_batches_equal_one_big_batch_fp32(m):
    """Gradients through keyed dropout (on) match to 1e-5 norm-wise per tensor."""
    big = RunConfig(micro_batch_size=8, num_micro_batches=1).validate()
    split = dataclasses.replace(big, micro_batch_size=8 // m, num_micro_batches=m)
    g_big, method = _grads_after_one_step(big)
    g_split, _ = _grads_after_one_step(split)
    assert method.model.cfg.dropout > 0 and method.model.cfg.attention_dropout > 0
    free = method.model.gradient_free()
    errors = {k: relative_error(g_split[k], g_big[k]) for k in g_big if k not in free}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= 1e-5, (worst, errors[worst])


def test_micro_batches_equal_one_big_batch_fp64_trajectory():
    """Three LAMB steps in FP64: the weights agree to rounding (key biases, whose exact gradient is zero,
    follow rounding noise and are left out as in the FP32 test)."""
    big = RunConfig(micro_batch_size=8, num_micro_batches=1).validate()
    split = dataclasses.replace(big, micro_batch_size=2, num_micro_batches=4)
    finals = []
    for run in (big, split):
        method = build_method(run, torch.device("cpu"))
        method.model.double()
        batches = synthetic_batches(run, padded=True)
        for _ in range(3):
            method.step(next(batches))
        finals.append({n: p.detach().clone() for named in method.layer_params for n, p in named})
    a, b = finals
    errors = {k: relative_error(a[k], b[k]) for k in a if k not in method.model.gradient_free()}
    assert max(errors.values()) <= 1e-10, max(errors.items(), key=lambda kv: kv[1])


def test_dropout_actually_changes_the_result():
    """The equivalence above is not vacuous: a different seed (other masks) moves the gradients."""
    run = RunConfig(micro_batch_size=8, num_micro_batches=1).validate()
    g1, _ = _grads_after_one_step(run)
    g2, _ = _grads_after_one_step(dataclasses.replace(run, seed=run.seed + 1))
    assert any(relative_error(g1[k], g2[k]) > 1e-2 for k in g1)


def test_amp_bf16_within_16bit_tolerance_of_fp32():
    run = RunConfig(method="amp", precision="bf16", micro_batch_size=2, num_micro_batches=4)
    result = check(run, "grad_accum", steps=3)
    assert result.tolerance == TOLERANCE["bf16"]
    assert result.passed, result.report(top=5)
    name, err = result.worst
    assert err > 1e-6, "bf16 should differ from fp32 at all; otherwise autocast did not engage"


def test_check_fails_a_wrong_method():
    """The oracle is not vacuous: a method that never updates the head fails it."""
    from baselines.grad_accum import GradAccum
    from suite.core import registry

    @registry.register("broken-head")
    class BrokenHead(GradAccum):
        def step(self, batch):
            head = self.model.num_layers - 1
            saved = [p.detach().clone() for _, p in self.layer_params[head]]
            stats = super().step(batch)
            with torch.no_grad():
                for (_, p), s in zip(self.layer_params[head], saved):
                    p.copy_(s)
            return stats

    try:
        result = check(RunConfig(method="broken-head", micro_batch_size=2, num_micro_batches=2), "grad_accum", 2)
        assert not result.passed
        assert result.worst[0].startswith(("classifier", "bert.pooler")) and result.worst[1] >= 0.99
    finally:
        registry.unregister("broken-head")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_check_fails_a_method_whose_update_is_right_and_whose_loss_is_not(precision):
    """A method with a correct update that reported its loss doubled passed the oracle, and the wrong loss went into
    its records' `final_loss`. Each step's reported loss is held to the reference's (LOSS_TOLERANCE)."""
    from baselines.amp import AMP
    from baselines.grad_accum import GradAccum
    from suite.core import registry
    from suite.core.check import LOSS_TOLERANCE

    base = GradAccum if precision == "fp32" else AMP

    @registry.register("doubled-loss")
    class DoubledLoss(base):
        precisions = (precision,)

        def step(self, batch):
            stats = super().step(batch)
            return dataclasses.replace(stats, loss=2 * stats.loss)

    try:
        run = RunConfig(method="doubled-loss", precision=precision, micro_batch_size=2, num_micro_batches=2)
        result = check(run, "grad_accum", 2)
        assert result.worst[1] <= result.tolerance  # the weights pass: only the loss tells it
        assert not result.passed and result.worst_loss[1] == pytest.approx(1.0, rel=1e-2)
        assert result.loss_tolerance == LOSS_TOLERANCE[precision]
        assert "FAIL" in result.report() and "loss 1.0" in result.report()
    finally:
        registry.unregister("doubled-loss")


@pytest.mark.parametrize("method, precision", [("grad_accum", "fp32"), ("amp", "bf16")])
def test_recompute_changes_nothing(method, precision):
    """Per-block activation recompute redraws the same keyed masks: bitwise the same training."""
    run = RunConfig(
        method=method, precision=precision, micro_batch_size=2, num_micro_batches=2, options={"recompute": "on"}
    ).validate()
    plain = dataclasses.replace(run, options={})
    a, b = build_method(run, torch.device("cpu")), build_method(plain, torch.device("cpu"))
    ba, bb = synthetic_batches(run, padded=True), synthetic_batches(plain, padded=True)
    for _ in range(2):
        a.step(next(ba))
        b.step(next(bb))
    wa, wb = a.state_dict(), b.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_check_names_both_precisions_and_refuses_two_16_bit_formats():
    """`suite check X --against amp` compared fp16 with amp's bf16 without naming either."""
    from baselines.amp import AMP
    from suite.config.errors import ConfigError
    from suite.core import registry

    run = RunConfig(method="l2l-cmp", precision="fp16", micro_batch_size=2, num_micro_batches=2)
    result = check(run, "amp", 1)  # amp runs fp16 as well: the same format on both sides
    assert (result.method, result.against) == ("l2l-cmp (fp16)", "amp (fp16)")
    assert result.report().startswith("check l2l-cmp (fp16) against amp (fp16):")

    @registry.register("amp-bf16-only")
    class BF16Only(AMP):
        precisions = ("bf16",)

    try:
        with pytest.raises(ConfigError, match="runs bf16, not fp16; comparing fp16 with bf16 says nothing"):
            check(run, "amp-bf16-only", 1)
    finally:
        registry.unregister("amp-bf16-only")
