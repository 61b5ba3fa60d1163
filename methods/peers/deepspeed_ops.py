"""DeepSpeed's native ops the peers use, built (or loaded) under the suite's lock on their folders: at set-up
(`make setup` runs this module), so that no timed cell pays for a build, and at a peer's start where one is
still missing.

DeepSpeed builds an op on first use under torch's lock file alone, which a build killed half-way leaves behind for
every later cell to wait on until its timeout; under the suite's lock (suite.harness.builds) it is known to be
stale and removed."""

from __future__ import annotations

import sys
import time

from suite.harness.builds import extension_builds

# On a CPU DeepSpeed's collectives take its shared-memory op; ZeRO-Offload's own CPU Adam (host_adam=deepspeed).
COMM, CPU_ADAM = "ShareMemCommBuilder", "CPUAdamBuilder"


def wanted(host_adam: bool) -> list[str]:
    """The ops a peer's run loads here: the CPU's collectives (on a CPU accelerator), and its CPU Adam if asked."""
    from deepspeed.accelerator import get_accelerator

    return ([COMM] if get_accelerator().device_name() == "cpu" else []) + ([CPU_ADAM] if host_adam else [])


def build(names: list[str]) -> list[str]:
    """Build or load the ops `names` that this machine can build; returns those it built or loaded. No collective
    runs meanwhile, so the ranks of one cell take their turns."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    builders = [b for b in map(accelerator.create_op_builder, names) if b is not None and b.is_compatible(False)]
    with extension_builds(tuple(b.name for b in builders)):
        for builder in builders:
            builder.load(verbose=False)
    return [b.name for b in builders]


def main() -> int:
    """Every op a peer may load here, built once; without DeepSpeed, or where a build fails, one line and exit 0:
    the peers then build what they need when they first run (or record why they cannot)."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("DeepSpeed is not installed: no ops to build")
        return 0
    started = time.time()
    try:
        built = build(wanted(host_adam=True))
    except Exception as exc:  # noqa: BLE001 — set-up goes on; a peer's cell says what went wrong
        print(f"warning: DeepSpeed's ops did not build ({type(exc).__name__}: {exc}); its peers build on first use")
        return 0
    print(f"DeepSpeed's ops {', '.join(built) or '(none needed here)'} ready in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
