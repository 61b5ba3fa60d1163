"""The source files a set of modules loads, found from their import statements without importing them, and a digest.

A record's code is its cell's (suite.core.cell_code): the files reached from the cell's entry modules by following
every import statement in each file reached (one inside a function too: that file may run it), parents' packages
included, and the files a module names as its own data (`__code_data__`, e.g. the C++ sources an extension builds
from). Only the project's and its plugins' modules are followed: a module of the standard library, or one an installed
distribution provides outside the checkout, is named by the versions a record states (torch, transformers), not hashed.
Nothing is imported: a module is located on sys.path as the import system would find it, every file read on each walk
and its syntax parsed once per content, so a planner states a cell's code in some milliseconds.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path

from suite.config.paths import ROOT

_ROOT = Path(os.path.realpath(ROOT))
_PREFIXES = tuple({Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".o", ".pyd")


@cache
def _distributed() -> frozenset[str]:
    """Top-level names an installed distribution provides, not one installed editable (`pip install -e`: its source
    is someone's own code, a plugin's, hashed like ours)."""
    editable = set()
    for dist in metadata.distributions():
        try:
            if json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable"):
                editable.add(dist.metadata["Name"])
        except (ValueError, OSError):
            continue
    return frozenset(top for top, dists in metadata.packages_distributions().items() if set(dists) - editable)


def _under(path: str, folder: Path) -> bool:
    return path == str(folder) or path.startswith(str(folder) + os.sep)


@cache
def _installed(top: str, origin: str) -> bool:
    """Whether a module is the standard library's or an installed distribution's (never hashed): the checkout's
    own files count as ours even where it is installed (editable), a virtual environment inside it does not."""
    if top in sys.stdlib_module_names or {"site-packages", "dist-packages"} & set(origin.split(os.sep)):
        return True
    if _under(origin, _ROOT):  # ours, unless in an environment's prefix that lies inside the checkout
        return any(_under(str(p), _ROOT) and _under(origin, p) for p in _PREFIXES)
    return top in _distributed() or any(_under(origin, p) for p in _PREFIXES)


_INSTALLED_TOPS: set[str] = set(sys.stdlib_module_names)  # top-level names found installed (never ours), so far
_LOADED: dict[str, tuple[object, Path | None]] = {}  # an imported module's file (it never moves), by module object


def locate(name: str) -> Path | None:
    """The file module `name` would be loaded from (a package's __init__.py), or None: not found, not Python source,
    or not ours (_installed). A module already imported is where it was loaded from; any other is looked for on
    sys.path package by package, as the import system would, without running a package's __init__."""
    top = name.partition(".")[0]
    if top in _INSTALLED_TOPS or (top != name and locate(top) is None and top in _INSTALLED_TOPS):
        return None
    loaded = sys.modules.get(name)
    if loaded is not None and name in _LOADED and _LOADED[name][0] is loaded:
        return _LOADED[name][1]
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None:
        origin = _find(name)
    path = _ours(top, name, origin)
    if loaded is not None and getattr(loaded, "__file__", None):
        _LOADED[name] = (loaded, path)
    return path


def _find(name: str) -> str | None:
    """Where module `name` is on the path (its origin), without importing anything: None where it is not."""
    parts, spec = name.split("."), None
    for i in range(len(parts)):
        try:  # a top-level name through every finder (an editable install's too), imported by none
            search = list(spec.submodule_search_locations or []) if spec is not None else None
            if spec is not None and not search:
                return None
            spec = (
                importlib.util.find_spec(parts[0]) if i == 0 else PathFinder.find_spec(".".join(parts[: i + 1]), search)
            )
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
    return spec.origin


def _ours(top: str, name: str, origin: str | None) -> Path | None:
    """The real path of a module's source where it is ours (not _installed), else None."""
    if not origin or not str(origin).endswith(".py"):
        return None
    real = os.path.realpath(origin)
    if _installed(top, real):
        if name == top:
            _INSTALLED_TOPS.add(top)
        return None
    return Path(real)


MISSING = "missing"  # the digest of a file gone since a cell named it (or since its module was imported)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


@cache
def _facts(data: bytes, name: str, path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a file holds for the walk (cached by its content, so an edit is seen whatever its size or time), as module
    `name` at `path`: the modules its import statements name, and the files or folders it names as its own
    (`__code_data__`, listed again on every walk)."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):  # a broken file is still code: hashed, with nothing to follow
        return (), ()
    return tuple(_imported(tree, name, path.name == "__init__.py")), tuple(_data(tree))


def _imported(tree: ast.Module, name: str, is_package: bool) -> list[str]:
    """The modules an import statement anywhere in `tree` (module `name`) may load: each dotted prefix of `import a.b`,
    and for `from m import x` the module m, its prefixes, and m.x (a submodule, where one is)."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[str] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{a.name}" for a in node.names if a.name != "*")]
        else:
            continue
        for target in filter(None, targets):
            out += _with_parents(target)
    return out


def _statements(nodes: list) -> Iterator[ast.stmt]:
    """Every statement, nested ones too (in a function, a class, a branch, a handler): where imports are."""
    for node in nodes:
        yield node
        for part in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, part, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _data(tree: ast.Module) -> list[str]:
    """The files or folders, beside it, a module names as its own code (`__code_data__ = ("csrc",)`)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__code_data__" for t in node.targets):
            try:
                entries = ast.literal_eval(node.value)
            except ValueError:
                return []
            return [entries] if isinstance(entries, str) else [str(e) for e in entries]
    return []


def _data_files(path: Path, entries: tuple[str, ...]) -> list[Path]:
    """The files `__code_data__` entries name beside module file `path`, as they are now (caches aside)."""
    out = []
    for entry in entries:
        where = path.parent / entry
        found = [where] if where.is_file() else sorted(where.rglob("*")) if where.is_dir() else []
        out += [f for f in found if f.is_file() and "__pycache__" not in f.parts and f.suffix not in SKIP_SUFFIXES]
    return out


def _digest(data: bytes | None) -> str:
    return MISSING if data is None else hashlib.sha256(data).hexdigest()[:12]


@cache
def display(path: Path) -> str:
    """A file's name in a record: relative to the checkout for its own files (alike on every machine), else absolute."""
    return path.relative_to(_ROOT).as_posix() if path.is_relative_to(_ROOT) else path.as_posix()


def files(modules: list[str] | tuple[str, ...], skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file the modules load (see the module's docstring), by display name, each with its content's digest (a
    file gone: MISSING); the modules `skip` names are neither hashed nor followed."""
    seen: set[str] = set(skip)
    found: dict[Path, str] = {}
    todo = [p for m in modules for p in _with_parents(m)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = locate(name)
        if path is None or path in found:
            continue
        data = _read(path)
        found[path] = _digest(data)
        if data is None or path.suffix != ".py":
            continue
        imported, entries = _facts(data, name, path)
        for f in _data_files(path, entries):
            found.setdefault(f, _digest(_read(f)))
        todo += [m for m in imported if m not in seen]
    return {display(p): found[p] for p in sorted(found)}


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def digest(named: dict[str, str]) -> str:
    """One digest of files and their contents' digests (files())."""
    h = hashlib.sha256()
    for name in sorted(named):
        h.update(f"{name}\0{named[name]}\n".encode())
    return h.hexdigest()[:16]


def changed(was: dict[str, str], now: dict[str, str]) -> list[str]:
    """The files that differ between two files() maps: edited, added or gone, by name."""
    return sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
