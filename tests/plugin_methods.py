"""Test-only methods loaded into cell processes through SUITE_PLUGINS, to make cells fail on purpose."""

from baselines.grad_accum import GradAccum
from suite.core.registry import register


@register("always-fails")
class AlwaysFails(GradAccum):
    """Raises inside the step, as a buggy method would."""

    def step(self, batch):
        raise ValueError("deliberate failure for the runner test")
