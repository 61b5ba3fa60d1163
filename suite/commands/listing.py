"""`suite list`: the methods, experiments and profiles, one aligned line each, from a copy kept beside the results
that names the code it was made from. Making the list imports every method and experiment (torch with them: seconds);
the copy is used while every source file of the tree reads as it did, so a second `suite list` takes no torch."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from suite.config import paths

PACKAGES = ("suite", "baselines", "methods", "experiments")  # the code a list is made from
PROFILES = (
    ("tiny", "CPU-sized models, minutes (CI)"),
    ("small", "a quick GPU run"),
    ("paper", "the paper's model sizes (needs a GPU)"),
    ("auto", "paper on CUDA, tiny on CPU"),
)


def _shown(value) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def option_text(name: str, option) -> str:
    """One option as `--set` takes it: `name=default`, then its values where it has a set of them (`off|on` for a
    switch, which takes on/off as every switch does)."""
    values = [_shown(c) for c in option.choices] or (["off", "on"] if isinstance(option.default, bool) else [])
    return f"{name}={_shown(option.default)}" + (f" ({'|'.join(values)})" if values else "")


def make() -> str:
    """The list, made from the registered methods and the experiments (imports them all)."""
    from suite.core import registry
    from suite.core.experiment import all_experiments

    methods = [(name, registry.get(name)) for name in registry.names()]
    experiments = sorted(all_experiments().items())
    width = max(len(n) for n in [*(n for n, _ in methods), *(n for n, _ in experiments), *(n for n, _ in PROFILES)])
    spans = max(len(",".join(cls.precisions)) for _, cls in methods)
    out = ["methods (name, precisions, what it is; options as --set takes them):"]
    for name, cls in methods:
        lines = (cls.__doc__ or "").strip().splitlines()
        doc = lines[0] if lines else f"(no description: {cls.__name__} has no docstring; its first line is this one)"
        doc = f"[peer: {cls.peer}] {doc}" if cls.peer else doc
        out.append(f"  {name:{width}s}  {','.join(cls.precisions):{spans}s}  {doc}")
        if cls.options:
            opts = ", ".join(option_text(k, o) for k, o in cls.options.items())
            out.append(f"  {'':{width}s}  {'':{spans}s}  options: {opts}")
    out.append("experiments:")
    out += [f"  {name:{width}s}  {exp.title}" for name, exp in experiments]
    out.append("profiles:")
    out += [f"  {name:{width}s}  {what}" for name, what in PROFILES]
    return "\n".join(out) + "\n"


def digest() -> str | None:
    """What the list is made from: every Python source of the tree, by path and content, and the torch installed
    (an experiment's rows may follow from it). None where plugins (SUITE_PLUGINS) name code outside the tree: the
    list is then made each time."""
    if os.environ.get("SUITE_PLUGINS", "").strip():
        return None
    from importlib import metadata

    h = hashlib.sha256()
    for pkg in PACKAGES:
        for path in sorted((Path(paths.ROOT) / pkg).rglob("*.py")):
            h.update(str(path.relative_to(paths.ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        h.update(metadata.version("torch").encode())
    except metadata.PackageNotFoundError:
        pass
    return h.hexdigest()[:16]


def folder() -> Path:
    return Path(paths.RESULTS_DIR) / ".cache" / "list"


def listing() -> str:
    """The list: the copy made from this very code where there is one, else made now and kept (where the results
    folder can be written: a read-only one only costs the next call its seconds). A process that has loaded the
    registry already (a test, a program that registered a method of its own) makes its list and keeps none: what it
    registered is not in the files the copy is keyed by."""
    if "suite.core.registry" in sys.modules:
        return make()
    key = digest()
    kept = folder() / f"{key}.txt" if key else None
    if kept is not None and kept.is_file():
        return kept.read_text()
    text = make()
    if kept is not None:
        try:
            from suite.config.files import write_atomic

            for old in folder().glob("*.txt"):  # one copy: that of the code as it reads now
                old.unlink(missing_ok=True)
            write_atomic(kept, text)
        except OSError:
            pass
    return text
