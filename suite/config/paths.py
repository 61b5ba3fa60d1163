"""Where the project lives and where its results go (`SUITE_RESULTS_DIR` moves the latter)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Read as `paths.RESULTS_DIR` at call time where tests point it at a temporary folder.
# A relative SUITE_RESULTS_DIR is the caller's: made absolute once, here, and handed on so, so that every cell process
# finds the folder its caller named whatever its working folder. An empty one is refused (RESULTS_REFUSED: every
# command says so in one line before anything runs); it meant the working folder.
_GIVEN = os.environ.get("SUITE_RESULTS_DIR")
RESULTS_REFUSED = (
    "SUITE_RESULTS_DIR is set but empty (it would mean the working folder): give the folder results go to, or unset "
    "it for results/ beside the code"
    if _GIVEN is not None and not _GIVEN.strip()
    else None
)
RESULTS_DIR = Path(_GIVEN.strip()).resolve() if _GIVEN and _GIVEN.strip() else Path(ROOT) / "results"
if _GIVEN and _GIVEN.strip():
    os.environ["SUITE_RESULTS_DIR"] = str(RESULTS_DIR)
# The folder of GLUE TSVs a run reads (`--data-dir`, `make table7 DATA_DIR=...`), inherited by its cells. A table
# is rendered without it: a section shows what its records and the definitions say, not what one run's folder made.
GLUE_DIR_ENV = "SUITE_GLUE_DIR"

# How the pages and the committed tables write a command of the suite's: the interpreter `make setup` makes.
DOCUMENTED_SUITE = ".venv/bin/python -m suite"


# A name that is one folder's or file's, never a path: what a machine slug, a cell key and a sweep id are.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def plain(name: str) -> bool:
    """Whether `name` is a plain name (PLAIN_NAME, and no `..` anywhere in it)."""
    return isinstance(name, str) and bool(PLAIN_NAME.fullmatch(name)) and ".." not in name


def inside(root: Path | str, path: Path | str) -> bool:
    """Whether `path`, resolved (links and `..` followed), lies inside `root`: a path built from a record's content,
    a listing file or a setting is used only where it does."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def suite_command() -> list[str]:
    """This process's way to run the suite, for a command it prints to be run as it is: its interpreter (relative to
    the current folder where it lies under it, e.g. .venv/bin/python), then -m suite."""
    exe = Path(sys.executable)
    try:
        exe = exe.relative_to(Path.cwd())
    except ValueError:
        pass
    return [str(exe), "-m", "suite"]


def repo_named(path) -> str:
    """A file as the repository names it (from its root), never as one machine's folders do; its name alone outside
    the repository."""
    try:
        return Path(path).resolve().relative_to(Path(ROOT).resolve()).as_posix()
    except ValueError:
        return Path(path).name
