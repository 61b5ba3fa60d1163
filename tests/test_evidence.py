"""Evidence a reader can trust (issue 51): a suspect row by rule, never by hand, with its reason and no ratio, bar or
verdict resting on it; a verdict read from several codes or thin rounds is provisional, never reproduced."""

from pathlib import Path

from suite.core.experiment import get_experiment
from suite.records.trust import suspect
from suite.report import claims, plots, tables
from suite.report.reading import Reading, Where

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _rec(rate=20.0, mfu=0.3, precision="fp32", code="c1", sweep="s1", profile="paper", device="cuda", rounds=3):
    return {
        "status": "ok",
        "profile": profile,
        "device_type": device,
        "sweep": sweep,
        "rounds": rounds,
        "finished": sweep,
        "config": {"run": {"precision": precision}},
        "metrics": {"throughput": rate, "mfu": mfu},
        "provenance": {"code": code, "commit": code * 7},
    }


def test_a_row_is_suspect_under_its_precisions_floor_on_a_gpu_or_when_its_rate_moved_2x():
    assert suspect(_rec()) is None
    assert "MFU 7.7%, under the 10% floor of fp32" in suspect(_rec(mfu=0.077))
    assert suspect(_rec(mfu=0.019, precision="fp16")) is None  # AMP at micro-batch 2: launch-bound, honest
    assert "under the 1% floor of bf16" in suspect(_rec(mfu=0.005, precision="bf16"))
    assert suspect(_rec(mfu=0.001, profile="tiny")) is None and suspect(_rec(mfu=0.001, device="cpu")) is None
    before = _rec(rate=21.5, code="c0", sweep="s0")
    said = suspect(_rec(rate=5.14), [before])
    assert "5.14 samples/s, 0.24x the 21.5 measured at c0c0c0c" in said
    assert suspect(_rec(rate=30.0), [before]) is None  # within 2x of the previous code
    again = _rec(rate=5.3, sweep="s2")  # a second sweep of its own code confirms it
    assert suspect(_rec(rate=5.14), [before, again]) is None


def test_the_h100s_514_record_is_suspect_with_its_reason_and_no_ratio_rests_on_it():
    """The committed record (Table 2's FP32 baseline on the H100 at 1253528): flagged in the table with its reason,
    and no row of its section takes a ratio to it, in the table or the figure."""
    exp = get_experiment("table2")
    secs = tables.sections(exp, RESULTS, warn=lambda _: None, variants=False)
    title, cells, records = next(s for s in secs if s[0].startswith("paper profile on h100-79gb"))
    base = records[[c.row.name for c in cells].index("baseline-fp32")]
    assert base["metrics"]["throughput"] < 6 and "MFU 7.7%" in base["suspect"]
    cols, rows = tables.table_rows(exp, cells, records)  # the table's, which the figures draw (no other)
    ratio = cols.index("throughput xbaseline-fp32 ours")
    assert all(r[ratio] is None for r in rows), [(r[0], r[ratio]) for r in rows]
    status = cols.index("status")
    assert "suspect: MFU 7.7%" in rows[0][status]
    assert any("h100-79gb · paper baseline-fp32 is suspect" in n for n in plots.suspect_notes(secs))


def test_a_verdict_on_one_round_or_several_codes_is_provisional():
    """Rates need 3 rounds of every row read (memory does not: what a step allocates does not vary by round); every
    row read must be of one code; a suspect row makes it provisional; an undecided verdict stays as it is."""
    where = Where("table2", "paper", "m")
    rows = {"a": {"throughput": 30.0, "mem": 1.0}, "b": {"throughput": 10.0, "mem": 2.0}}

    def verdict(ra, rb, column):
        r = Reading(where, rows, {"a": ra, "b": rb})
        v = "reproduced" if r.value("a", column) > r.value("b", column) else "not reproduced"
        return claims.provisional(v, r)

    assert verdict(_rec(), _rec(), "throughput") == "reproduced"
    assert verdict(_rec(rounds=1), _rec(), "mem") == "not reproduced"  # memory: one round is enough
    got = verdict(_rec(rounds=1), _rec(), "throughput")
    assert got == "provisional (reproduced): fewer than 3 timing rounds (`a` 1)", got
    got = verdict(_rec(code="c1"), _rec(code="c2"), "mem")
    assert got == "provisional (not reproduced): read from several codes (commits c1c1c1c, c2c2c2c)", got
    assert "`a` suspect (MFU 7.7%)" in verdict({**_rec(), "suspect": "MFU 7.7%"}, _rec(), "mem")
    older = {**_rec(), "provenance": {"commit": "cd78134d" * 5}}  # before code digests: its commit says
    assert "several codes (commits c1c1c1c, cd78134)" in verdict(older, _rec(), "mem")
    not_run = {**_rec(), "provenance": None}  # a row not run names no code: no doubt of that kind
    assert verdict(not_run, _rec(), "mem") == "not reproduced"
    assert claims.provisional("pending", Reading(where, rows, {"a": _rec(code="x"), "b": _rec()})) == "pending"


def test_a_section_mixing_codes_marks_the_rows_of_another_code_and_takes_no_ratio_of_them():
    """Table 3's H100 section holds rows of three codes (a05344b, 54ccf55, cd78134d): a row of another code than its
    reference's is shown for context with its commit, and no ratio to the reference is taken of it."""
    exp = get_experiment("table3")
    secs = tables.sections(exp, RESULTS, warn=lambda _: None)
    _, cells, records = next(s for s in secs if s[0].startswith("paper profile on h100-79gb"))
    cols, rows = tables.table_rows(exp, cells, records)
    by = {r[0]: dict(zip(cols, r)) for r in rows}
    ratio = f"throughput x{exp.baseline} ours"
    assert "another code: 54ccf55 (the reference's a05344b)" in by["l2l-cmp-u2"]["status"]
    assert by["l2l-cmp-u2"][ratio] is None and by["l2l-cmp-u2"]["throughput (samples/s) ours"] is not None
    assert "another code" not in by[exp.baseline]["status"]


def test_a_key_change_does_not_hide_a_2x_move(tmp_path):
    """A row whose cell key changed (steps 5 -> 3, warm-up 2 -> 1) is held to the previous record of the same row,
    machine and profile, and the change of key is named; the committed H100 rows that moved 2-4x so are flagged."""
    from suite.records import store
    from suite.records.index import Index

    def rec(key, rate, code, finished, steps, status="ok"):
        run = {"precision": "fp16", "steps": steps}
        return {
            **_rec(rate=rate, code=code, sweep=finished, precision="fp16", rounds=1), "key": key, "row": "l2l-cmp",
            "experiment": "table2", "method": "l2l-cmp", "variant": "", "status": status,
            "config": {"run": run}, "machine": {"slug": "h100-79gb"},
        }  # fmt: skip

    store.save(tmp_path, "old", "h100-79gb", rec("old", 31.151, "c0", "2026-11-23", 5, "partial: 1/3 rounds"))
    store.save(tmp_path, "new", "h100-79gb", rec("new", 129.56, "c1", "2026-11-27", 3))
    index = Index(tmp_path)
    now = index.cell("new", "h100-79gb")
    said = suspect(now, index.history(now))
    assert said.startswith("130 samples/s, 4.16x the 31.2 measured at c0c0c0c under another cell (steps 5 -> 3)"), said
    exp = get_experiment("table2")
    title, _, records = next(
        s for s in tables.sections(exp, RESULTS) if s[0] == "paper profile on h100-79gb (cuda device)"
    )
    cmp = next(r for r in records if r and r["row"] == "l2l-cmp")
    assert "4.16x the 31.2 measured at cd78134 under another cell (steps 5 -> 3" in cmp["suspect"]


def test_bars_of_one_colour_from_several_codes_name_their_commit():
    """Table 3's figure draws each micro-batch count's ratio within its sweep; where a section's bars come from two
    codes, each bar names its commit and the legend says why (issue 62)."""
    from types import SimpleNamespace

    from experiments import table3

    def rec(rate, sweep, commit):
        return {**_rec(rate=rate, sweep=sweep, code=commit[0]), "provenance": {"code": commit, "commit": commit * 2}}

    rows = {"l2l-cmp-u1": rec(80, "a", "aaaa"), "amp-rc-u1": rec(100, "a", "aaaa")}
    rows |= {"l2l-cmp-u2": rec(120, "b", "bbbb"), "amp-rc-u2": rec(100, "b", "bbbb")}
    cells = [SimpleNamespace(row=SimpleNamespace(name=n)) for n in rows]
    fig = table3._target_bars([("paper profile on h100-79gb (cuda device)", cells, list(rows.values()))])
    said = [t.get_text() for t in fig.axes[0].texts]
    assert "0.8x\naaaaaaa" in said and "1.2x\nbbbbbbb" in said, said
    one = {k: {**v, "provenance": {"code": "c", "commit": "c" * 8}} for k, v in rows.items()}
    fig = table3._target_bars([("paper profile on h100-79gb (cuda device)", cells, list(one.values()))])
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["0.8x", "1.2x"]


def test_no_rounds_is_one_round_a_pending_verdict_keeps_its_doubts_and_table7_reads_through_the_reading():
    """A record that says no rounds rests on one; an undecided verdict keeps the doubts of the figures beside it;
    Table 7's judge reads its records through the reading, so its several codes make it provisional (issue 62)."""
    where = Where("table2", "paper", "m")
    rows = {"a": {"throughput": 30.0}, "b": {"throughput": 10.0}}
    bare = {k: v for k, v in _rec().items() if k != "rounds"}  # a record made before the field
    r = Reading(where, rows, {"a": bare, "b": _rec()})
    r.value("a", "throughput")
    assert claims.provisional("reproduced", r) == "provisional (reproduced): fewer than 3 timing rounds (`a` 1)"
    assert plots.thin(bare)
    r = Reading(where, rows, {"a": _rec(code="c1"), "b": _rec(code="c2")})
    r.value("a", "throughput"), r.value("b", "throughput")
    assert claims.provisional("pending", r) == "pending (read from several codes (commits c1c1c1c, c2c2c2c))"
    assert claims.codes_read(r) == " [`a`: c1c1c1c; `b`: c2c2c2c]"  # each figure's code beside it
    t7 = [c for c in claims.load_claims() if c.where.experiment == "table7"]
    rendered = claims.render(t7, RESULTS)
    assert t7 and rendered.count("provisional (reproduced (6 of 6 tasks)): read from several codes") == len(t7)


def _copies(tmp_path, experiment, machine, **changed):
    """The committed records of `experiment` on `machine`, saved again under `tmp_path` with `changed` fields."""
    import json

    from suite.records import store

    for path in (RESULTS / "runs" / machine).glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == experiment and not rec.get("variant"):
            store.save(tmp_path, rec["key"], machine, {**rec, **changed})


def test_a_one_round_rate_is_marked_in_the_status_column_beside_its_ratio(tmp_path):
    """A row of one timing round says so in the status column where its ratio is printed (Table 3's H100 rows read
    plain `ok` beside their one-round ratios); three rounds need no mark."""
    exp = get_experiment("table3")
    for rounds, marked in ((1, True), (3, False)):
        _copies(tmp_path / str(rounds), "table3", "h100-79gb", rounds=rounds, sweep="s", suspect=None)
        secs = tables.sections(exp, tmp_path / str(rounds), warn=lambda _: None, variants=False)
        _, cells, records = next(s for s in secs if s[0] == "paper profile on h100-79gb (cuda device)")
        cols, rows = tables.table_rows(exp, cells, records)
        status = dict((r[0], r[cols.index("status")]) for r in rows)
        assert ("1 timing round (fewer than 3: provisional)" in status["l2l-cmp-u2"]) == marked, status["l2l-cmp-u2"]
        briefs = dict(zip((c.row.name for c in cells), tables.briefs(exp, cells, records)))
        assert ("1 timing round" in briefs["amp-rc-u2"]) == marked


def test_the_17b_claim_quotes_the_count_not_the_formula():
    """Table 6's claim reads the counted host peak (the `host need` columns are the formula's, a different figure)."""
    t6 = [c for c in claims.load_claims() if c.where.experiment == "table6"]
    line = claims.render(t6, RESULTS)
    exp = get_experiment("table6")
    _, cells, records = next(s for s in tables.sections(exp, RESULTS, warn=lambda _: None) if "counted" in s[0])
    counted = next(r for r in records if r and r["row"] == "turing-17b")["metrics"]["host_peak_gb"]
    assert f"{counted:.0f} GB on the host, both counted" in line, line


def test_a_claim_on_a_cpu_reads_the_most_complete_then_newest_section(tmp_path):
    """Table 4's claim read a pre-fingerprint section of one round while a newer 3-round sweep stood beside it
    (issue 62): a claim at `tiny` names no machine by hand; it reads the CPU section with the most rows measured,
    then the newest, and says which it read."""
    from suite.report.reading import ANY_CPU, read

    reading = read(Where("table4", "tiny", ANY_CPU), RESULTS)  # the committed records: the newer 3-round sweep
    assert reading.where.machine == "cpu-epyc-f25m1-avx2-2c" and reading.records["N-ranks-u1"]["rounds"] == 3
    t4 = [c for c in claims.load_claims() if c.where.experiment == "table4"]
    assert "`cpu-epyc-f25m1-avx2-2c`, tiny, measured" in claims.render(t4, RESULTS)
    # the rule itself, on two CPUs with the same rows: as complete, the newest; more complete, whatever its age
    import json

    from suite.records import store

    mine = [json.loads(p.read_text()) for p in (RESULTS / "runs" / "cpu-epyc-f25m1-avx2-2c").glob("*.json")]
    mine = [r for r in mine if r["experiment"] == "table4" and r["profile"] == "tiny"]
    for slug, finished, rows in (("cpu-old", "2026-01-01", 6), ("cpu-new", "2026-02-01", 6)):
        for rec in mine[:rows]:
            store.save(
                tmp_path, rec["key"], slug, {**rec, "finished": finished, "machine": {**rec["machine"], "slug": slug}}
            )
    assert read(Where("table4", "tiny", ANY_CPU), tmp_path).where.machine == "cpu-new"
    (tmp_path / "runs" / "cpu-new" / f"{mine[0]['key']}.json").unlink()  # the newer one lacks a row
    assert read(Where("table4", "tiny", ANY_CPU), tmp_path).where.machine == "cpu-old"


def test_one_rule_tells_codes_apart_for_every_reader():
    """A code is its digest (its commit where it predates the digest): one code of two commits is one label naming
    both, two codes of one commit (a dirty tree) two labels naming their digests; a row of no code has none."""

    def rec(code, commit):
        return {"provenance": {"code": code, "commit": commit * 8}}

    same_code = [rec("c1", "a"), rec("c1", "b")]
    assert set(tables.codes(same_code).values()) == {"aaaaaaa/bbbbbbb"}
    dirty = [rec("c1", "a"), rec("c2", "a"), None, {"provenance": None}]
    assert tables.codes(dirty) == {0: "aaaaaaa (code c1)", 1: "aaaaaaa (code c2)"}
    where = Where("table2", "paper", "m")
    r = Reading(where, {"x": {"mem": 1.0}, "y": {"mem": 2.0}}, {"x": same_code[0], "y": same_code[1]})
    r.value("x", "mem"), r.value("y", "mem")
    assert r.doubts() == [] and claims.codes_read(r) == ""  # one code: no doubt, no marks
