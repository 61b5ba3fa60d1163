"""The native build leaves nothing behind: a kill during it leaves no compiler running, and a lock file torch left
from a build killed half-way never makes the next load wait."""

import os
import signal
import subprocess
import sys
import time

import pytest

from suite.harness import fused_lamb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A process that loads the kernel with the CLI's SIGTERM handling (it turns SIGTERM into an interrupt).
LOADER = """
import signal, sys
def stop(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
from suite.harness import fused_lamb
print("loaded" if fused_lamb.kernel() is not None else "fallback", flush=True)
"""


def _build_dir(env_root=None) -> str:
    from torch.utils import cpp_extension

    _, digest = fused_lamb.shared_source()
    old = os.environ.get("TORCH_EXTENSIONS_DIR")
    try:
        if env_root:
            os.environ["TORCH_EXTENSIONS_DIR"] = env_root
        return cpp_extension._get_build_directory(fused_lamb.extension_name(digest), False)
    finally:
        if env_root:
            os.environ.pop("TORCH_EXTENSIONS_DIR")
            if old is not None:
                os.environ["TORCH_EXTENSIONS_DIR"] = old


def _processes_naming(text: str) -> list[str]:
    """Processes whose command line names `text` (the compilers) or that run in a folder under it (ninja)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if text in cmd or cwd.startswith(text):
            found.append(f"{pid}: {cmd[:200]}")
    return found


def test_a_stale_lock_from_a_killed_build_does_not_make_the_next_load_wait():
    assert fused_lamb.kernel() is not None  # built (make setup builds it): the folder exists
    lock = os.path.join(_build_dir(), "lock")
    open(lock, "w").close()  # what a build killed half-way leaves: torch's own load would wait on it for ever
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", LOADER], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "loaded", out.stderr[-2000:]
    assert not os.path.exists(lock)


def test_a_sigterm_during_the_build_leaves_no_compiler_running(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", LOADER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    while not _processes_naming(str(tmp_path)) and time.monotonic() < deadline:  # the compiler has started
        time.sleep(0.2)
    assert _processes_naming(str(tmp_path)), "the build never started"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    time.sleep(1.0)
    assert _processes_naming(str(tmp_path)) == []  # ninja and the compilers went with it
    build = _build_dir(str(tmp_path))
    with fused_lamb._build_lock(__import__("pathlib").Path(build)):  # the next build: any lock left is gone
        assert not os.path.exists(os.path.join(build, "lock"))
