"""Whether a long-lived worker process is still as a fresh one would be for what a cell uses (issue 65, item 2).

A cell that replaces a library's function (an attention-replacing plugin patching `torch.nn.Linear.forward`), or
leaves a thread running, changes what every later cell in the same process runs. The worker asks `taint()` before
each job; where it names anything, the job runs in a fresh process instead (suite.core.worker_client). Three rules:

- **Replaced**: the functions and classes of the libraries every cell runs (torch and transformers), at module level
  and in the classes each module defines, are those the worker saw when it first saw the module (`Baseline`), or
  the library's own (torch._dynamo wraps `torch.manual_seed` when it is imported, as it would in a fresh process).
  A module first imported by a job is taken as that job left it, so the second rule covers it.
- **Foreign**: no such attribute is a function defined in the suite's tree or a plugin (a file under the repository
  that is no installed library's): torch's and transformers' own code never holds one, a patch does.
- **Threads**: every thread alive was alive when the worker began (after the last job's objects are collected, a
  thread their pool ended is given a moment to finish).

A method that changes process state these rules cannot see declares it (`Method.patches_globals`): the worker ends
after its job, so the next job starts in a fresh process. torch's own per-process settings are restored between
jobs (suite.core.worker.between_cells). Each check takes some tens of milliseconds (the loaded modules' dicts)."""

from __future__ import annotations

import functools
import os
import sys
import threading
import types
import warnings
from pathlib import Path

from suite.config import paths

THREAD_GRACE_S = 1.0  # how long a thread an earlier job started may take to end (its pool shut down) before it counts
LIBRARIES = ("torch", "transformers")  # the libraries whose functions every cell runs, and a patch replaces


def _function(value):
    """The function a class attribute holds (a static or class method's own); never asks the value anything else (a
    module's __getattr__ may start a device: torch.backends.cuda's does)."""
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


def _values(name: str, mod) -> list[tuple[str, object]]:
    """Every callable of module `name` (functions, builtins, classes, partials), and every callable of the classes it
    defines, by label."""
    d = getattr(mod, "__dict__", None)
    if not isinstance(d, dict):
        return []
    out = []
    for attr, value in list(d.items()):
        if callable(value):
            out.append((attr, value))
        if isinstance(value, type) and value.__dict__.get("__module__") == name:
            out += [(f"{attr}.{a}", f) for a, f in list(vars(value).items()) if callable(_function(f))]
    return [(label, _function(v)) for label, v in out]


def _members(name: str, mod) -> dict[str, int]:
    """id() of each of the module's _values."""
    return {label: id(v) for label, v in _values(name, mod)}


def _watched() -> list[tuple[str, types.ModuleType]]:
    return [(n, m) for n, m in list(sys.modules.items()) if m is not None and n.split(".")[0] in LIBRARIES]


@functools.cache
def _place(filename: str) -> str:
    """Where a function's source file lies: "library" (torch's or transformers' installed files), "ours" (the suite's
    tree or a plugin: under the repository, in no installed library), else "other" (the standard library, another
    package, generated code such as a dataclass's `<string>`)."""
    if not filename or filename.startswith("<"):
        return "other"
    path = Path(os.path.realpath(filename))
    dirs = [Path(os.path.realpath((vars(sys.modules[n]).get("__file__") or ""))).parent for n in LIBRARIES
            if n in sys.modules]  # fmt: skip
    if any(path.is_relative_to(d) for d in dirs):
        return "library"
    if path.is_relative_to(Path(os.path.realpath(paths.ROOT))) and "site-packages" not in path.parts:
        return "ours"
    return "other"


def _file(value) -> str | None:
    """The source file of a Python function (a wrapper's own, not the name functools.wraps copied onto it)."""
    return value.__code__.co_filename if isinstance(value, types.FunctionType) else None


def _library_own(value) -> bool:
    """Whether `value` is torch's or transformers' own: a Python function whose code lies in their installed files, or
    a builtin or class they define (a patch is neither: its code is the patcher's, whatever name it copies)."""
    file = _file(value)
    if file is not None:
        return _place(file) == "library"
    if isinstance(value, type):
        return str(value.__dict__.get("__module__")).split(".")[0] in LIBRARIES
    if isinstance(value, types.BuiltinFunctionType):
        return str(value.__module__).split(".")[0] in (*LIBRARIES, "builtins", "None")
    return False


def _ours(value) -> bool:
    """Whether `value` is a function of the suite's tree or a plugin's."""
    file = _file(value)
    return file is not None and _place(file) == "ours"


class Baseline:
    """What the worker saw of the watched modules and threads (see the module)."""

    def __init__(self):
        self.members: dict[str, dict[str, int]] = {}
        self.threads = {t.ident for t in threading.enumerate()}
        self.see()

    def see(self) -> None:
        """Take the modules imported since the last look as they are now."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, mod in _watched():
                if name not in self.members:
                    self.members[name] = _members(name, mod)

    def taint(self) -> list[str]:
        """What an earlier job changed that a fresh process would not have (empty: as fresh), then take the modules
        imported since as they stand."""
        said = []
        with warnings.catch_warnings():  # (a deprecated alias warns when it is looked at)
            warnings.simplefilter("ignore")
            for name, mod in _watched():
                seen = self.members.get(name, {})
                for label, value in _values(name, mod):
                    if _library_own(value):
                        continue  # the library's own (torch._dynamo wraps torch.manual_seed when it is imported)
                    if (label in seen and seen[label] != id(value)) or _ours(value):
                        file = _file(value)
                        said.append(f"{name}.{label} is {getattr(value, '__qualname__', type(value).__name__)}"
                                    + (f" ({Path(file).name})" if file else ""))  # fmt: skip
            alive = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
            for t in alive:  # a pool shut down as its method was collected ends in a moment: it is waited for
                t.join(timeout=THREAD_GRACE_S)
            alive = [t for t in alive if t.is_alive()]
            said += [f"thread {t.name!r} left running" for t in alive]
            self.see()
        return sorted(set(said))
