"""Native builds through torch's extension loader (the suite's fused LAMB, a peer's ops such as DeepSpeed's): each
folder held under a lock the kernel keeps for the holding process, so that a lock file torch left behind (a build
killed half-way, on which every later load would wait for ever) is known to be stale and removed."""

from __future__ import annotations

import contextlib
from pathlib import Path

FLOCK = "memtrain.flock"  # the suite's own lock in a build folder; torch's is `lock`


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

    with contextlib.ExitStack() as stack:
        for name in sorted(names):  # one order everywhere: two holders never wait on each other
            stack.enter_context(build_lock(Path(cpp_extension._get_build_directory(name, False))))
        yield
