"""Native builds through torch's extension loader (the suite's fused LAMB, a peer's ops such as DeepSpeed's): each
folder held under a lock the kernel keeps for the holding process, so that a lock file torch left behind (a build
killed half-way, on which every later load would wait for ever) is known to be stale and removed."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

FLOCK = "memtrain.flock"  # the suite's own lock in a build folder; torch's is `lock`


def prepare_environment() -> None:
    """What every native build of the suite's runs with, in every process alike, before torch's loader is called:
    - the environment's own tools first on PATH (pip's ninja, 1.13 here, which the project installs): a build run by
      another ninja (the system's 1.11) finds the first one's log (.ninja_log v7 against v5) of another version and
      builds everything again, inside whichever cell loads it next (DeepSpeed's shared-memory op, about 60 s of both
      cores, was built at set-up by one and again in the first test run by the other);
    - in a virtual environment, its own build folder (<venv>/torch-extensions), unless TORCH_EXTENSIONS_DIR names
      one: a build's rule holds its environment's include paths, so two checkouts that shared ~/.cache's folder
      rebuilt DeepSpeed's ops back and forth (the suite's LAMB has a name per installation; DeepSpeed's ops cannot)."""
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if not os.environ.get("TORCH_EXTENSIONS_DIR") and (root := build_root()):
        os.environ["TORCH_EXTENSIONS_DIR"] = root


def build_root() -> str | None:
    """Where this process's native builds go: TORCH_EXTENSIONS_DIR where given, else in a virtual environment its own
    folder, else None (torch's default, ~/.cache/torch_extensions)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    return os.path.join(sys.prefix, "torch-extensions") if sys.prefix != sys.base_prefix else None


@contextlib.contextmanager
def build_lock(build_dir: Path):
    """Hold `build_dir` under a lock the kernel keeps for this process (it ends with the process, however it ends).
    Under it no other build of the suite's can be running, so torch's `lock` file there is stale and removed."""
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock alone
        yield
        return
    with open(build_dir / FLOCK, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        yield


@contextlib.contextmanager
def extension_builds(names: tuple[str, ...]):
    """Hold the build folders of torch extensions `names` (torch's own folders for them) while a library builds or
    loads them on first use: DeepSpeed's ops, which it builds inside a cell under torch's lock file."""
    from torch.utils import cpp_extension

    prepare_environment()
    with contextlib.ExitStack() as stack:
        for name in sorted(names):  # one order everywhere: two holders never wait on each other
            stack.enter_context(build_lock(Path(cpp_extension._get_build_directory(name, False))))
        yield
