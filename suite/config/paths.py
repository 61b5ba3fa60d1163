"""Where the project lives and where its results go (`SUITE_RESULTS_DIR` moves the latter)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Read as `paths.RESULTS_DIR` at call time where tests point it at a temporary folder.
# An empty SUITE_RESULTS_DIR is unset (not the working folder); a relative one is the caller's, made absolute here
# and handed on so, so that every cell process finds the folder its caller named, whatever its working folder.
_GIVEN = os.environ.get("SUITE_RESULTS_DIR", "").strip()
RESULTS_DIR = Path(_GIVEN).resolve() if _GIVEN else Path(ROOT) / "results"
if _GIVEN:
    os.environ["SUITE_RESULTS_DIR"] = str(RESULTS_DIR)
# The folder of GLUE TSVs a run reads (`--data-dir`, `make table7 DATA_DIR=...`), inherited by its cells. A table
# is rendered without it: a section shows what its records and the definitions say, not what one run's folder made.
GLUE_DIR_ENV = "SUITE_GLUE_DIR"

# How the pages and the committed tables write a command of the suite's: the interpreter `make setup` makes.
DOCUMENTED_SUITE = ".venv/bin/python -m suite"


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
