"""A render at HEAD changes nothing (issue 62): `python -m suite render` from the records rewrites every table, figure,
the README's claims and the docs' excerpts exactly as they stand in the checkout (in a fresh clone, as committed), on
whatever machine renders them, and writes no file that is not committed (ignored caches aside). Figures are compared
by name (their pixels follow the matplotlib that draws them, which a fresh environment may update); every text file
byte for byte."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tracked(under: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", under], cwd=ROOT, capture_output=True, text=True)
    return set(out.stdout.split())


def test_a_render_of_the_committed_records_leaves_every_file_as_committed(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing says what is committed")
    tracked = _tracked("results") | _tracked("docs") | {"README.md"}
    for name in tracked:  # the committed files alone, as a fresh clone has them
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, tmp_path / name)
    env = {**os.environ, "SUITE_RESULTS_DIR": str(tmp_path / "results"), "SUITE_MACHINE": "a-machine-of-its-own"}
    env.pop("SUITE_GLUE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "suite", "render"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=580
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    ignored = subprocess.run(  # caches the repository ignores (the planner's profiles): never committed
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(written - tracked),
        capture_output=True,
        text=True,
    ).stdout.split()
    assert sorted(written - tracked - set(ignored)) == [], "a render wrote files that are not committed"
    assert sorted(tracked - written) == [], "a render removed committed files"
    changed = [
        name
        for name in sorted(tracked)
        if not name.endswith(".png") and (tmp_path / name).read_bytes() != (ROOT / name).read_bytes()
    ]
    assert changed == [], f"a render at HEAD rewrote {changed} (run `.venv/bin/python -m suite render`, commit)"
