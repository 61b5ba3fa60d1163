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
