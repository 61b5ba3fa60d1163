"""The README is a map: at most 250 lines, a link to every docs/ page, and no link that leads nowhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def _links(path: Path) -> list[Path]:
    return [(path.parent / m.group(1)).resolve() for m in LINK.finditer(path.read_text()) if "://" not in m.group(1)]


def test_the_readme_is_short_and_links_every_docs_page():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 250
    linked = set(_links(readme))
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and [p.name for p in pages if p.resolve() not in linked] == []


def test_every_relative_link_leads_to_a_file():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        missing = [str(p.relative_to(ROOT)) for p in _links(path) if not p.exists()]
        assert missing == [], f"{path.name}: {missing}"


def test_every_docs_page_opens_with_a_title_and_a_paragraph():
    for page in sorted((ROOT / "docs").glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and lines[1] == "" and lines[2] and not lines[2].startswith(("#", "|", "-")), (
            page.name
        )


SUITE = re.compile(r"^(?P<python>(?:PYTHONPATH=\. )?\S*python\S*) -m suite(?P<rest>(?: .*)?)$")
# Where the suite runs: the project's environment (`make setup` makes .venv, the Makefile's VENV), the mimic
# environment (.venv-mimic), or a lent GPU machine's image, which has no venv and runs the tree (PYTHONPATH=.).
RUNS_IN = (".venv/bin/python", "PYTHONPATH=. python", "PYTHONPATH=. .venv-mimic/bin/python")
PLACEHOLDER = re.compile(r"[\[\]|<>]|\.\.\.|^[A-Z][A-Z_]+$")


def _commands(path: Path) -> list[str]:
    """The commands a page shows: each line of its shell blocks, and each inline code span (joined where a line
    break cuts it), comments dropped."""
    text = path.read_text()
    blocks = re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", text, re.S)
    lines = [ln.split("  #")[0].strip() for b in blocks for ln in b.splitlines()]
    prose = re.sub(r"```.*?```|<!--.*?-->", "", text, flags=re.S)
    spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]
    return [c for c in lines + spans if c]


def test_every_documented_command_runs_as_written_after_make_setup():
    """Every `python -m suite ...` a page shows names the interpreter that has the suite (never a bare `python`,
    which has no torch until the venv is activated), parses as the command line takes it, and every `make X` names
    a target; a documented command runs (`suite list`)."""
    import shlex
    import subprocess

    from suite.commands.cli import build_parser

    targets = set(re.findall(r"^([\w-]+(?: [\w-]+)*):", (ROOT / "Makefile").read_text(), re.M))
    targets = {t for group in targets for t in group.split()}
    seen, parsed = [], 0
    verbs = next(a.choices for a in build_parser()._actions if getattr(a, "choices", None))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command in _commands(path):
            if command.startswith("make "):
                target = command.split()[1]
                assert "=" in target or target in targets, f"{path.name}: `{command}`: no such make target"
                continue
            m = SUITE.match(command)
            if not m:
                continue
            seen.append(command)
            assert m["python"] in RUNS_IN, f"{path.name}: `{command}`: run it as `.venv/bin/python -m suite ...`"
            argv = shlex.split(m["rest"])
            if len(argv) == 1 and argv[0] in verbs:
                continue  # a verb named in prose (`... -m suite run`), not a command
            if not argv or any(PLACEHOLDER.search(a) for a in argv):
                continue  # a synopsis, not a command
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                raise AssertionError(f"{path.name}: `{command}` does not parse") from exc
            parsed += 1
    assert len(seen) >= 20 and parsed >= 8, (len(seen), parsed)  # the pages show commands, and most parse
    python = ROOT / ".venv" / "bin" / "python"
    if python.exists():  # where `make setup` ran (make test's own environment)
        out = subprocess.run([str(python), "-m", "suite", "list"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0 and "grad_accum" in out.stdout, out.stderr
