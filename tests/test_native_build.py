"""The native build leaves nothing behind: a kill during it leaves no compiler running, and a lock file torch left
from a build killed half-way never makes the next load wait."""

import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest

from suite.harness import builds, fused_lamb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A process that loads the kernel with the CLI's SIGTERM handling (it turns SIGTERM into an interrupt).
LOADER = """
import signal, sys
def stop(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, stop)
from suite.harness import builds, fused_lamb
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
    build = _build_dir()  # this environment's own (extension_name): no other environment builds in it
    lock = os.path.join(build, "lock")
    with open(os.path.join(build, "memtrain.flock"), "w") as held:  # no build of this environment is running now
        fcntl.flock(held, fcntl.LOCK_EX)
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
    with builds.build_lock(__import__("pathlib").Path(build)):  # the next build: any lock left is gone
        assert not os.path.exists(os.path.join(build, "lock"))


def test_each_torch_installation_builds_in_a_folder_of_its_own(monkeypatch):
    """Two environments (two venvs, even of one torch) never share a build folder, whose ninja rule names one
    installation's include paths: shared, each would rebuild it after the other. One environment's name is stable
    (every checkout and cell process that uses it loads the same build)."""
    import torch

    _, digest = fused_lamb.shared_source()
    here = fused_lamb.extension_name(digest)
    child = subprocess.run(
        [sys.executable, "-c", f"from suite.harness import fused_lamb; print(fused_lamb.extension_name({digest!r}))"],
        env={**os.environ, "PYTHONPATH": ROOT}, cwd="/", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.stdout.strip() == here, child.stderr[-2000:]
    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv/lib/site-packages/torch/__init__.py")
    assert fused_lamb.extension_name(digest) != here
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert fused_lamb.extension_name(digest) != here


def test_every_build_runs_with_the_environments_ninja_in_its_own_folder(monkeypatch):
    """A build by the system's ninja (1.11) and the next by pip's (1.13) read each other's log as of another version and
    built every op again; two checkouts sharing ~/.cache's folder rebuilt DeepSpeed's ops back and forth. Every
    build of the suite's prepares one environment: the interpreter's own bin first on PATH, and a virtual
    environment's own folder unless TORCH_EXTENSIONS_DIR names one."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    builds.prepare_environment()
    assert os.environ["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    in_venv = sys.prefix != sys.base_prefix
    assert os.environ.get("TORCH_EXTENSIONS_DIR") == (os.path.join(sys.prefix, "torch-extensions") if in_venv else None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/elsewhere")  # a folder named by the user is kept
    builds.prepare_environment()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/elsewhere" == builds.build_root()
