"""Test-only methods loaded into cell processes through SUITE_PLUGINS, to make cells fail on purpose."""

from baselines.grad_accum import GradAccum
from suite.core.registry import register


@register("always-fails")
class AlwaysFails(GradAccum):
    """Raises inside the step, as a buggy method would."""

    def step(self, batch):
        raise ValueError("deliberate failure for the runner test")


@register("sleeps")
class Sleeps(GradAccum):
    """Writes its pid to $SUITE_TEST_PIDFILE, then sleeps: a cell that outlives a killed runner unless killed too."""

    def step(self, batch):
        import os
        import time

        with open(os.environ["SUITE_TEST_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
        return super().step(batch)
