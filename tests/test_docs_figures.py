"""Prose explains; it quotes no result. A result figure in the README or a docs page sits inside a block that
`python -m suite render` writes from the records (between `<!-- NAME: generated ... -->` and `<!-- NAME: end -->`),
never typed by hand, where the next record leaves it behind.

What counts as a result figure (outside code, inline code spans and generated blocks):
- a rate: any number in samples/s, tokens/s, TFLOPS, GB/s or ns a parameter, or bytes a parameter;
- a measured-looking figure: a number with decimals in a ratio (1.44x), a percentage, a size (GB, MB, GiB, ...) or a
  time (s, ms, minutes);
- a size or time of three digits or more (361 GB, 876 s): results, unless it is a constant of the machine
  catalogue (a device's or host's memory) or a host the experiments define, which the test reads from them.
Round figures of configuration and rules (a 16 GB cap, a 10% floor, a 2x move) are words of the design, not results.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RATE = r"(?:samples/s|tokens/s|TFLOPS|GB/s|GiB/s|ns/param\w*|ns a param\w*|bytes a param\w*|bytes/param\w*)"
SIZE = r"(?:[KMGT]i?B)\b"
TIME = r"(?:ms|s|minutes?|min|h)\b"
NUM = r"(?<![\w./#=-])[-+]?\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?P<num>{NUM})\s?(?P<unit>{RATE}|{SIZE}|{TIME}|%|x\b|×)")
GENERATED = re.compile(r"<!-- (?P<name>[\w-]+): generated.*?<!-- (?P=name): end -->", re.S)


def _prose(text: str) -> str:
    """`text` without its code blocks, generated blocks, HTML comments and inline code spans."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = GENERATED.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _constants() -> set[str]:
    """The machine catalogue's memory figures, as prose names them (`80 GB`, `126 GiB`), and the hosts the decoder
    experiments define (`128 GiB`)."""
    from experiments.decoder import HOSTS
    from suite.measure import machines

    return {f"{int(x)} {unit}" for x, unit in machines.stated_sizes()} | set(HOSTS)


def hand_typed(text: str, allowed: set[str] = frozenset()) -> list[str]:
    """The result figures typed by hand in `text` (see the module)."""
    out = []
    for m in FIGURE.finditer(_prose(text)):
        num, unit = m["num"], m["unit"]
        digits = re.sub(r"\D", "", num.split(".")[0])
        if re.fullmatch(RATE, unit):
            out.append(m.group(0))
        elif "." in num and unit not in ("h",):
            out.append(m.group(0))
        elif re.fullmatch(rf"{SIZE}|{TIME}", unit) and len(digits) >= 3 and f"{int(digits)} {unit}" not in allowed:
            out.append(m.group(0))
    return out


def test_the_rule_finds_what_it_names():
    assert hand_typed("ran at 169.3 samples/s, 1.44x AMP; 361 GB on the host; set-up 369 s; MFU 44.2%") == [
        "169.3 samples/s",
        "1.44x",
        "361 GB",
        "369 s",
        "44.2%",
    ]
    assert hand_typed("a 16 GB cap, a 10% floor, a 2x move, 3 rounds, 80 GB", {"80 GB"}) == []
    assert hand_typed("`1.44x` in code\n<!-- t: generated x -->\n4.73 GB\n<!-- t: end -->\n") == []


def test_no_result_figure_is_typed_by_hand_in_the_readme_or_docs():
    allowed = _constants()
    found = {
        path.relative_to(ROOT).as_posix(): figures
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        if (figures := hand_typed(path.read_text(), allowed))
    }
    assert found == {}, "result figures typed by hand (render them from the records, or say it in words): " + str(found)


def test_every_excerpt_in_the_readme_and_docs_is_what_a_render_writes():
    """The README and docs agree with the records: each generated excerpt is rendered again from results/runs/ and
    must read as committed (`python -m suite render` rewrites them)."""
    from suite.report import excerpts

    stale = [
        path.name
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        if excerpts.rewrite(text := path.read_text(), ROOT / "results", path) != text
    ]
    assert stale == [], f"excerpts that differ from the records (run `.venv/bin/python -m suite render`): {stale}"


def test_an_excerpt_names_its_machine_kind_and_each_rows_code(tmp_path):
    """An excerpt of rows of two codes marks each row's commit; its caption names the section and what the figures
    are; a spec naming a row the section lacks is one clear error."""
    import json as _json

    import pytest

    from suite.config.errors import ConfigError
    from suite.records import store
    from suite.report import excerpts

    def rec(row, commit, code, throughput):
        return {
            "key": f"k-{row}", "experiment": "table3", "row": row, "method": "l2l-cmp", "profile": "paper",
            "device_type": "cuda", "variant": "", "status": "ok", "finished": "2026-11-01T00:00:00", "sweep": "s",
            "config": {"kind": "throughput", "run": {"method": "l2l-cmp", "precision": "fp16"}},
            "metrics": {"throughput": throughput}, "rounds": 3, "machine": {"slug": "h100-79gb"},
            "provenance": {"commit": commit, "code": code},
        }  # fmt: skip

    store.save(tmp_path, "k-amp-rc-u1", "h100-79gb", rec("amp-rc-u1", "aaaaaaa1", "c1", 100.0))
    store.save(tmp_path, "k-l2l-cmp-u1", "h100-79gb", rec("l2l-cmp-u1", "bbbbbbb2", "c2", 120.0))
    spec = {"experiment": "table3", "section": "paper profile on h100-79gb (cuda device)"}
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    opening = f"<!-- excerpt: {excerpts.MARK}; "
    both = _json.dumps({**spec, "rows": ["amp-rc-u1", "l2l-cmp-u1"], "columns": []})
    text = f"{opening}{both} -->\n<!-- excerpt: end -->\n"
    out = excerpts.rewrite(text, tmp_path, page)
    assert "paper profile on h100-79gb (cuda device); measured; rows of several codes" in out
    assert "| amp-rc-u1 | aaaaaaa |" in out and "| l2l-cmp-u1 | bbbbbbb |" in out
    assert "](../table3.md#paper-profile-on-h100-79gb-cuda-device)" in out
    assert excerpts.rewrite(out, tmp_path, page) == out  # rendering again changes nothing
    with pytest.raises(ConfigError, match="no row or column 'nope'"):
        excerpts.rewrite(
            f"{opening}{_json.dumps({**spec, 'rows': ['nope']})} -->\n<!-- excerpt: end -->\n", tmp_path, page
        )
