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
    """Every function and class of module `name`, and every function of the classes it defines, by label."""
    d = getattr(mod, "__dict__", None)
    if not isinstance(d, dict):
        return []
    out = []
    for attr, value in list(d.items()):
        if isinstance(value, (types.FunctionType, type)):
            out.append((attr, value))
        if isinstance(value, type) and value.__dict__.get("__module__") == name:
            out += [
                (f"{attr}.{a}", f) for a, f in list(vars(value).items()) if isinstance(_function(f), types.FunctionType)
            ]
    return [(label, _function(v)) for label, v in out]


def _members(name: str, mod) -> dict[str, int]:
    """id() of each of the module's _values."""
    return {label: id(v) for label, v in _values(name, mod)}


def _watched() -> list[tuple[str, types.ModuleType]]:
    return [(n, m) for n, m in list(sys.modules.items()) if m is not None and n.split(".")[0] in LIBRARIES]


def _ours(module: str | None) -> bool:
    """Whether code of `module` is the suite's tree or a plugin's: a file under the repository that is not in an
    installed library (a virtual environment's site-packages lies under it too)."""
    mod = sys.modules.get(module or "")
    file = (getattr(mod, "__dict__", None) or {}).get("__file__")
    if not file:
        return False
    path = Path(file).resolve()
    in_tree = path.is_relative_to(Path(paths.ROOT).resolve()) and "site-packages" not in path.parts
    return in_tree or (module or "").split(".")[0] in os.environ.get("SUITE_PLUGINS", "").split(",")


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
                    origin = (
                        getattr(value, "__module__", None) if isinstance(value, (types.FunctionType, type)) else None
                    )
                    if str(origin).split(".")[0] in LIBRARIES:
                        continue  # the library's own (torch._dynamo wraps torch.manual_seed when it is imported)
                    changed = label in seen and seen[label] != id(value)
                    if changed or (isinstance(value, types.FunctionType) and _ours(origin)):
                        said.append(f"{name}.{label} is {origin}.{getattr(value, '__qualname__', '?')}")
            alive = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
            for t in alive:  # a pool shut down as its method was collected ends in a moment: it is waited for
                t.join(timeout=THREAD_GRACE_S)
            alive = [t for t in alive if t.is_alive()]
            said += [f"thread {t.name!r} left running" for t in alive]
            self.see()
        return sorted(set(said))
