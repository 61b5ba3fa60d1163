"""Test-only methods loaded into cell processes through SUITE_PLUGINS, to make cells fail on purpose."""

from baselines.grad_accum import GradAccum
from suite.core.registry import Option, register


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


def _unscaled_peer():
    """torch's GPipe with its own gradient scaling left on over a loss already divided by the minibatch: every
    gradient 1/m of grad_accum's. The peers' oracle must catch it."""
    from methods.peers.torch_pipelining import TorchPipeline

    @register("torch-gpipe-double-scaled")
    class DoubleScaled(TorchPipeline):
        schedule_class = "ScheduleGPipe"
        options = {"stages": Option(2), "recompute": Option(False), "timeout": Option(300.0)}
        scale_grads = True

    return DoubleScaled


_unscaled_peer()


@register("dies")
class Dies(GradAccum):
    """Kills its own process in the step, as the kernel's OOM killer would: SIGKILL, no record."""

    def step(self, batch):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


@register("oom-killed")
class OomKilled(GradAccum):
    """Dies as the kernel's OOM killer kills: its count in $SUITE_TEST_VMSTAT (the runner's stand-in for /proc/vmstat)
    goes up, then SIGKILL."""

    def step(self, batch):
        import os
        import signal

        with open(os.environ["SUITE_TEST_VMSTAT"], "w") as f:
            f.write("pgfault 7\noom_kill 1\n")
        os.kill(os.getpid(), signal.SIGKILL)


@register("unsettles")
class Unsettles(GradAccum):
    """Changes what a process keeps for every later cell (torch's threads, FP32 matmul precision and TF32, the
    default dtype) and leaves them so, as a careless method or library would."""

    def step(self, batch):
        import torch

        torch.set_num_threads(1)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        out = super().step(batch)
        torch.set_default_dtype(torch.float64)
        torch.set_anomaly_enabled(True)
        return out


def _slow_linear(self, x):
    """torch.nn.Linear's forward, twice: what an attention-replacing library's patch costs a later cell."""
    import torch.nn.functional as F

    F.linear(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


@register("patches-linear")
class PatchesLinear(GradAccum):
    """Replaces torch.nn.Linear.forward for every later cell of its process and leaves it so, as an
    attention-replacing plugin does."""

    def step(self, batch):
        import torch

        torch.nn.Linear.forward = _slow_linear
        return super().step(batch)


@register("declares-patch")
class DeclaresPatch(GradAccum):
    """Changes a library's constant, which no check of functions sees, and says so (Method.patches_globals)."""

    patches_globals = True

    def step(self, batch):
        import torch

        torch.nn.modules.module._global_forward_hooks_always_called = {}  # (a module-level dict: not a function)
        return super().step(batch)


def register_again() -> None:
    """Register this module's cell-failing methods in a test process that unregistered them (the module stays
    imported, so importing it again registers nothing)."""
    made = (("always-fails", AlwaysFails), ("sleeps", Sleeps), ("dies", Dies), ("oom-killed", OomKilled))
    more = (("unsettles", Unsettles), ("patches-linear", PatchesLinear), ("declares-patch", DeclaresPatch))
    for name, cls in (*made, *more):
        register(name)(cls)
