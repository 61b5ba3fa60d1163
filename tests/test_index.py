"""The one index over the records: each question it answers, read once, and read again when a record changes."""

import json

from suite.records import store
from suite.records.index import Index, open_index


def _rec(key, slug, row="r", finished="2026-11-01T00:00:00", sweep="s1", status="ok", throughput=10.0, **more):
    return {
        "key": key,
        "experiment": "table2",
        "row": row,
        "method": "grad_accum",
        "profile": "paper",
        "device_type": "cuda",
        "variant": "",
        "config": {"run": {"method": "grad_accum"}},
        "finished": finished,
        "status": status,
        "metrics": {"throughput": throughput},
        "provenance": {"code": "c1"},
        "machine": {"slug": slug},
        "sweep": sweep,
        **more,
    }


def test_the_index_answers_what_each_reader_asks(tmp_path):
    store.save(tmp_path, "k1", "h100-79gb", _rec("k1", "h100-79gb", finished="2026-11-01"))
    store.save(tmp_path, "k2", "h100-79gb", _rec("k2", "h100-79gb", finished="2026-11-03", throughput=40.0))
    store.save(tmp_path, "k1", "h200-140gb", _rec("k1", "h200-140gb", finished="2026-11-02"))
    # a later sweep replaces k1 on the H100: the store keeps the earlier `ok` record aside
    store.save(tmp_path, "k1", "h100-79gb", _rec("k1", "h100-79gb", finished="2026-11-04", sweep="s2"))
    index = Index(tmp_path)
    assert index.cell("k1", "h100-79gb")["sweep"] == "s2"
    assert index.cell("k9", "h100-79gb") is None
    assert [r["machine"]["slug"] for r in index.others("k1", "h100-79gb")] == ["h200-140gb"]
    assert [r["sweep"] for r in index.kept("k1", "h100-79gb")] == ["s1"]
    assert index.kept("k1", "h100-79gb", "s1")[0]["finished"] == "2026-11-01"
    assert index.kept("k1", "h100-79gb", "s9") == []
    assert len(index.records()) == 3  # current records only
    assert index.latest("table2", "r", "h100-")["key"] == "k1"  # the latest of the row, whatever its key
    assert index.latest("table2", "r", "h")["machine"]["slug"] == "h100-79gb"
    assert index.latest("table2", "r", "h200-")["key"] == "k1"
    assert index.latest("table2", "r", "h100-", where=lambda r: r["key"] == "k2")["metrics"]["throughput"] == 40.0
    assert index.latest("table2", "other", "h100-") is None
    assert set(index.latest_each("h100-")) == {("table2", "r", "paper")}
    # the other records of the same row, machine, profile and device, across keys and kept records alike
    now = index.cell("k1", "h100-79gb")
    assert [(r["key"], r["sweep"]) for r in index.history(now)] == [("k1", "s1"), ("k2", "s1")]
    store.save(tmp_path, "k3", "h100-79gb", _rec("k3", "h100-79gb", finished="2026-11-05", device_type="cpu"))
    assert len(Index(tmp_path).history(now)) == 2  # a CPU run of the row on that machine is another section's


def test_an_open_index_is_read_once_and_again_when_a_record_changes(tmp_path, monkeypatch):
    store.save(tmp_path, "k1", "m", _rec("k1", "m"))
    first = open_index(tmp_path)
    assert open_index(tmp_path) is first and first.cell("k1", "m")["metrics"]["throughput"] == 10.0
    reads = []
    monkeypatch.setattr(Index, "_read", lambda self, path, real=Index._read: reads.append(path) or real(self, path))
    first.records()
    assert reads == []  # read once: asking again reads no file
    store.save(tmp_path, "k2", "m", _rec("k2", "m"))  # a save in this process
    assert first.cell("k2", "m") is not None
    path = store.run_path(tmp_path, "k1", "m")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "metrics": {"throughput": 99.0}}))  # rewritten by another process
    assert open_index(tmp_path).cell("k1", "m")["metrics"]["throughput"] == 99.0


def test_an_unreadable_record_is_named_once_in_a_command(tmp_path):
    folder = tmp_path / "runs" / "m"
    folder.mkdir(parents=True)
    (folder / "bad.json").write_text("{not json")
    said = []
    index = Index(tmp_path)
    assert index.cell("bad", "m", warn=said.append) is None
    assert index.records(warn=said.append) == []
    assert len(said) == 1 and "bad.json is not a readable record" in said[0]
