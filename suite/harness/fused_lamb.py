"""The host's native kernels (csrc/: the fused LAMB, L2L-CMP's one-pass AdamW commit), one extension module built
once per source, CPU and torch installation and shared by every checkout that uses that installation, or None with
a warning."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import signal
import subprocess
import sys
import warnings
from pathlib import Path

from suite.harness.builds import build_lock, prepare_environment
from suite.harness.processes import session_ticks

SOURCES = Path(__file__).with_name("csrc")  # every .cpp there is one source of the module
__code_data__ = ("csrc",)  # and so part of the code of every cell that loads this module (suite.measure.sources)
# -march=native: the build is this CPU's (its name carries the CPU's flags, so a shared cache never hands one
# machine another's code). fp-contract=off keeps the foreach LAMB's roundings; no-math-errno lets sqrt vectorise.
# -fopenmp compiles the pragmas but is not passed to the linker: the OpenMP calls bind to the runtime torch has
# already loaded (its bundled libgomp), so torch.set_num_threads and the kernel share one pool. A torch without
# one leaves them unresolved: the load fails and the foreach LAMB stands in, with the warning below.
FLAGS = ["-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]


def _cpu_tag() -> str:
    """A short digest of what the compiler targets with -march=native: architecture, CPU model and flags."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            text += "".join(line for line in f if line.startswith(("model name", "flags", "Features")))[:4096]
    except OSError:
        pass
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def _torch_tag() -> str:
    """A short digest of the torch installation a build compiles against: where it lies (the build's rule names its
    include folders), its version and the Python headers. Two environments, even of the same torch, each have their
    own build; checkouts that share one environment share its build."""
    import sysconfig

    import torch

    where = os.path.realpath(os.path.dirname(torch.__file__))
    text = "|".join((where, torch.__version__, sysconfig.get_paths().get("include", ""), sys.version.split()[0]))
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def shared_source() -> tuple[list[Path], str]:
    """The kernels' sources, copied to a folder named by their digest under torch's extension folder, and that
    digest. Every checkout of the same sources builds from these paths under one name, so the build (and ninja's
    rule, which names the sources' paths) is one per source, CPU and torch installation (extension_name), made once
    and reused by every checkout and cell process of that installation; a changed source is a new name, built anew."""
    files = sorted(SOURCES.glob("*.cpp"))
    texts = {f.name: f.read_bytes() for f in files}
    digest = hashlib.blake2b(b"".join(n.encode() + b"\0" + t for n, t in texts.items()), digest_size=6).hexdigest()
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    folder = root / "memtrain-sources" / f"host-{digest}"
    paths = []
    for name, text in texts.items():
        path = folder / name
        if not path.exists() or path.read_bytes() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(text)
            os.replace(tmp, path)  # atomic: a process beside this one never reads half a source
        paths.append(path)
    return paths, digest


def extension_name(digest: str) -> str:
    """The extension's name (and its build folder's): one per source digest, CPU and torch installation. One folder
    built by two environments would be rebuilt back and forth: its rule holds the include paths of whichever built
    it last (seen: some 43 rebuilds in 20 minutes, each about 25 s of a core, inside cell processes)."""
    return f"memtrain_host_{_cpu_tag()}_{_torch_tag()}_{digest}"


_why: list[str] = []  # why the build failed in this process, if it did
_APART = "SUITE_FUSED_LAMB_BUILDING"  # set in the process that builds apart: it builds in place


def _build_apart() -> None:
    """Build the kernel in a process of its own, in a process group of its own with the ninja and compilers it
    starts: an interrupt or SIGTERM of this process (the CLI turns SIGTERM into one) kills that group whole, so no
    compiler outlives the run; a SIGKILL leaves the build to finish on its own and release its locks."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite.harness.fused_lamb"],
        env={**os.environ, _APART: "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait()
    except BaseException:
        _kill_session(proc.pid)
        proc.wait()
        raise


def _kill_session(sid: int) -> None:
    """Kill every process of session `sid`: ninja puts each compiler in a process group of its own, so killing the
    build's group would leave them running; the session holds them all."""
    for pid in session_ticks(sid) or {}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile
            continue
    try:
        os.killpg(sid, signal.SIGKILL)  # where there is no /proc
    except ProcessLookupError:
        pass


_asked = [False]  # whether the running cell asked for the kernel (reset() per cell: a worker's cells say their own)


def reset() -> None:
    """Forget that the kernel was asked for: each cell records only its own (suite/core/cell.execute calls it)."""
    _asked[0] = False


def status() -> str | None:
    """What the host's LAMB ran with, for the record: 'fused', 'foreach (fallback: why)', 'foreach
    (SUITE_FUSED_LAMB=0)'; None where nothing asked for the fused kernel since the last reset()."""
    if not _asked[0]:
        return None
    if compiled() is not None:
        return "fused"
    return f"foreach (fallback: {_why[0]})" if _why else "foreach (SUITE_FUSED_LAMB=0)"


def kernel():
    """The compiled module (`lamb_step`), or None where it cannot be built (the caller falls back to foreach
    LAMB); the running cell's record then names it (status())."""
    _asked[0] = True
    return compiled()


@functools.cache
def compiled():
    """The module, built or loaded once per process. SUITE_FUSED_LAMB=0 turns it off; =require makes a failed build
    an error (docs/host-optimizer.md)."""
    mode = os.environ.get("SUITE_FUSED_LAMB", "1")
    if mode not in ("0", "1", "require"):
        warnings.warn(f"SUITE_FUSED_LAMB={mode!r} is not one of 0, 1, require; taken as 1", stacklevel=2)
    if mode == "0":
        return None
    prepare_environment()  # ninja from pip (the project's), and the environment's own build folder
    try:
        from torch.utils import cpp_extension

        native = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
        sources, digest = shared_source()
        name = extension_name(digest)
        build_dir = Path(cpp_extension._get_build_directory(name, False))
        if not (build_dir / f"{name}.so").exists() and not os.environ.get(_APART):
            _build_apart()  # what it could not build, the load below tries again and says why
        with build_lock(build_dir):  # built: ninja finds it up to date
            paths = [str(s) for s in sources]
            return cpp_extension.load(name=name, sources=paths, extra_cflags=FLAGS + native, verbose=False)
    except Exception as exc:  # noqa: BLE001 — no compiler, no ninja, a failed build: all mean the fallback
        if mode == "require":
            raise RuntimeError(f"the fused LAMB kernel did not build: {exc}") from exc
        _why.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
        warnings.warn(
            f"fused LAMB unavailable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "the host runs the foreach LAMB, about 3-5x slower per parameter. It needs a C++ compiler and ninja "
            "(pip install ninja); SUITE_FUSED_LAMB=0 silences this.",
            stacklevel=2,
        )
        return None


if __name__ == "__main__":  # `make setup` builds it once, so that no run pays for the build
    built = kernel()
    print(f"fused LAMB kernel: {'built for this CPU' if built else 'unavailable; the foreach LAMB stands in'}")
