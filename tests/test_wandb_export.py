"""`python -m suite wandb` without the network: a folder of records (measured, counted, oom, contended, suspect, on
two machines) exported offline, each run read back from W&B's own files (issue 64, item 6)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import real_wandb

from suite.config.run import RunConfig
from suite.core.experiment import Experiment, Metric, Row
from suite.records import store, tracking
from suite.report import wandb_export, wandb_reports, wandb_runs

ROWS = [
    Row("ref", "grad_accum", paper={"throughput": 10.0, "memory_gb": 2.0}),
    Row("fast", "amp", paper={"throughput": 16.0, "memory_gb": 1.5}),
    Row("busy", "l2l", paper={"throughput": 8.0, "memory_gb": 1.0}),
    Row("odd", "l2l-cmp", paper={"throughput": 9.0, "memory_gb": 0.8}),
]
EXP = Experiment(
    name="export-test",
    title="export test",
    source="tests",
    baseline="ref",
    metrics=[Metric("throughput", "throughput"), Metric("memory_gb", "memory", unit="GB")],
    label_columns=[],
    rows=lambda profile: ROWS,
    base=lambda profile: {},
)
CPU, GPU = "cpu-test-2c", "h100-79gb"


def _rec(key, row, slug, *, status="ok", kind="throughput", code="c1", finished="2026-11-02T00:00:00", **metrics):
    method = next(r.method for r in ROWS if r.name == row)
    rounds = metrics.pop("rounds", None)
    if rounds:
        metrics.update(throughput=sorted(rounds)[len(rounds) // 2], throughput_rounds=rounds)
    return {
        "key": key,
        "experiment": EXP.name,
        "row": row,
        "method": method,
        "profile": "tiny",
        "device_type": "cuda" if slug == GPU else "cpu",
        "variant": "",
        "settings": [],
        "config": {"run": RunConfig(method=method).to_dict(), "kind": kind},
        "finished": finished,
        "status": status,
        "metrics": metrics,
        "provenance": {"code": code, "commit": code * 20, "threads": 2 if slug == CPU else "16"},
        "machine": {"slug": slug},
        "sweep": "s1",
        "rounds": len(rounds or [1]),
        "error": None,
    }


def _fixture(results: Path) -> None:
    busy = {"contended": True, "reasons": ["another process took 1.2 cores"]}
    saved = [
        _rec("k-ref", "ref", CPU, rounds=[10.0, 10.5, 9.5], memory_gb=2.0),
        _rec("k-fast", "fast", CPU, rounds=[19.0, 20.0, 21.0], memory_gb=1.0),
        _rec("k-busy", "busy", CPU, rounds=[5.0, 9.0, 7.0], memory_gb=0.5, contention=busy),
        # the same row under another key and code, ten times slower: the later record is suspect
        _rec("k-odd-old", "odd", CPU, rounds=[4.0, 4.0, 4.0], code="c0", finished="2026-11-01T00:00:00"),
        _rec("k-odd", "odd", CPU, rounds=[40.0, 41.0, 39.0], memory_gb=0.4),
        _rec("k-ref", "ref", GPU, kind="count", memory_gb=3.0, memory_kind="counted (fake tensors)"),
        _rec("k-fast", "fast", GPU, kind="count", status="oom", memory_gb=90.0, memory_kind="counted"),
    ]
    for rec in saved:
        store.save(results, rec["key"], rec["machine"]["slug"], rec)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The fixture folder exported once, and the console's lines."""
    real_wandb()
    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(var, str(root / var.lower()))
        mp.setenv("WANDB_DIR", str(root / "wandb"))
        mp.setenv("NETRC", str(root / "no-netrc"))
        for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
            mp.delenv(var, raising=False)
        results = root / "results"
        _fixture(results)
        said = []
        done = wandb_export.export(results, None, [EXP], progress=said.append, warn=lambda _: None)
        again = []
        second = wandb_export.export(results, None, [EXP], progress=again.append, warn=lambda _: None)
        yield results, root / "wandb", done, said, second, again


def _leet(run_dir: Path) -> dict:
    exe = Path(sys.executable).with_name("wandb")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "wandb"]
    out = subprocess.run([*cmd, "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True, check=True,
                         env={**os.environ, "WANDB_MODE": "offline"})  # fmt: skip
    return next(r["run"] for r in map(json.loads, out.stdout.splitlines()) if r["type"] == "run")


def _run(wandb_dir: Path, slug: str, key: str) -> tuple[dict, dict, list[dict]]:
    rid = tracking.run_id({"machine": {"slug": slug}, "key": key})
    (folder,) = tracking.offline_runs(wandb_dir, rid)[rid]
    return _leet(folder), tracking.read_offline_run(str(folder)), tracking.read_offline_history(str(folder))


def test_every_record_is_one_offline_run_and_the_console_counts_them(exported):
    _, wandb_dir, done, said, _, _ = exported
    assert (done.chosen, done.offline, done.online, done.unchanged, done.failed) == (7, 7, 0, 0, [])
    assert said[0] == "W&B: 7 record(s): 7 run(s) written, 0 unchanged since the last export", said
    runs = wandb_dir / "wandb"
    assert f"W&B: 7 offline run(s) under {runs}; to upload them: wandb sync {runs}/offline-run-*" in said
    assert sum(len(v) for v in tracking.offline_runs(wandb_dir).values()) == 7


def test_a_second_export_writes_no_run_and_a_changed_record_updates_its_own(exported, tmp_path, monkeypatch):
    results, wandb_dir, _, _, second, again = exported
    assert (second.offline, second.unchanged) == (0, 7)
    assert again[0] == "W&B: 7 record(s): 0 run(s) written, 7 unchanged since the last export", again
    # a copy of both folders, measured again in one cell
    results, wandb_dir = (Path(shutil.copytree(d, tmp_path / d.name)) for d in (results, wandb_dir))
    before = tracking.offline_runs(wandb_dir)
    rec = _rec("k-fast", "fast", CPU, rounds=[18.0, 20.0, 22.0], memory_gb=1.0, finished="2026-11-03T00:00:00")
    store.save(results, "k-fast", CPU, rec)
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    third = wandb_export.export(results, "offline", [EXP], progress=lambda _: None, warn=lambda _: None)
    after = tracking.offline_runs(wandb_dir)
    rid = tracking.run_id(rec)
    assert (third.offline, third.unchanged) == (1, 6) and after.keys() == before.keys()
    assert len(after[rid]) == 1 and after[rid] != before[rid]  # the same id, its one folder written anew
    assert tracking.read_offline_history(str(after[rid][0]))[2] == {"step": 2, "throughput": 22.0}


def test_a_measured_run_reads_back_with_its_tags_ratio_paper_and_rounds(exported):
    _, wandb_dir, _, _, _, _ = exported
    run, got, history = _run(wandb_dir, CPU, "k-fast")
    assert (run["run_id"], run["run_group"], run["job_type"]) == (f"{CPU}-k-fast", EXP.name, "amp")
    assert run["tags"] == ["method:amp", "precision:fp32", "profile:tiny", f"machine:{CPU}", "machine-kind:cpu",
                           "measured"]  # fmt: skip
    cfg, s = got["config"], got["summary"]
    assert (cfg["machine"], cfg["sweep"], cfg["table_sweep"], cfg["record_kind"], cfg["rounds"]) == (
        CPU, "s1", "s1", "measured", 3)  # fmt: skip
    assert cfg["section"] == f"tiny profile on {CPU} (cpu device)" and cfg["in_table"] is True
    assert s["throughput"] == 20.0 and s["ratio/throughput"] == 2.0 and s["ratio_paper/throughput"] == 1.6
    assert s["paper/throughput"] == 16.0 and s["ratio/memory_gb"] == 0.5 and s["within_noise/throughput"] is False
    assert (s["contended"], s["suspect"], s["provisional"], s["status"]) == (False, False, False, "ok")
    assert history == [
        {"step": 0, "throughput": 19.0},
        {"step": 1, "throughput": 20.0},
        {"step": 2, "throughput": 21.0},
    ]


def test_the_trust_marks_travel_and_take_the_ratio_as_the_table_does(exported):
    _, wandb_dir, _, _, _, _ = exported
    run, got, _ = _run(wandb_dir, CPU, "k-busy")
    s = got["summary"]
    assert "contended" in run["tags"] and s["contended"] is True and "ratio/throughput" not in s
    assert s["ratio/memory_gb"] == 0.25  # a busy machine's memory ratio stands, as in the table
    run, got, _ = _run(wandb_dir, CPU, "k-odd")
    s = got["summary"]
    assert "suspect" in run["tags"] and s["suspect"] is True and "10.00x the 4" in s["suspect_reason"]
    assert "samples/s" in s["suspect_reason"] and "ratio/throughput" not in s and "ratio_paper/throughput" in s
    run, got, _ = _run(wandb_dir, CPU, "k-odd-old")  # replaced in its table by the later record: a run all the same
    assert "not-in-table" in run["tags"] and got["config"]["in_table"] is False and got["config"]["section"] == ""


def test_counted_and_oom_records_on_another_machine(exported):
    _, wandb_dir, _, _, _, _ = exported
    run, got, history = _run(wandb_dir, GPU, "k-ref")
    assert "counted" in run["tags"] and "machine-kind:h100" in run["tags"] and history == []
    assert got["config"]["section"] == f"tiny profile on {GPU} (cuda device)" and got["summary"]["memory_gb"] == 3.0
    run, got, _ = _run(wandb_dir, GPU, "k-fast")
    assert got["summary"]["status"] == "oom" and got["summary"]["status_kind"] == "oom" and "counted" in run["tags"]


def test_each_field_has_one_type_in_every_run(exported):
    results, _, _, _, _, _ = exported
    runs = wandb_runs.payloads(results, [EXP], warn=lambda _: None)
    types: dict[str, set] = {}
    for run in runs:
        for part in ("config", "summary"):
            for k, v in wandb_runs._flat(getattr(run, part)).items():
                if v is not None:
                    types.setdefault(f"{part}:{k}", set()).add("number" if type(v) in (int, float) else type(v))
    assert {k: t for k, t in types.items() if len(t) > 1} == {}
    # the fixture's threads are 2 on one machine and "16" on the other: text in both
    assert {run.config["provenance"]["threads"] for run in runs} == {"2", "16"}


def test_a_report_definition_names_every_row_of_each_section(exported):
    results, wandb_dir, done, _, _, _ = exported
    assert done.definitions == [wandb_reports.path_of(wandb_dir, EXP.name)]
    defn = json.loads(done.definitions[0].read_text())
    assert [s["title"] for s in defn["sections"]] == [f"tiny profile on {m} ({d} device)" for m, d in
                                                      ((CPU, "cpu"), (GPU, "cuda"))]  # fmt: skip
    for sec in defn["sections"]:
        assert [r["row"] for r in sec["rows"]] == [r.name for r in ROWS]
        assert all(f"| {r.name} |" in sec["table"] for r in ROWS)
    cpu = defn["sections"][0]
    assert [r["run"] for r in cpu["rows"]] == [f"{CPU}-k-{n}" for n in ("ref", "fast", "busy", "odd")]
    assert cpu["panels"][0]["metrics"] == ["ratio/throughput", "ratio_paper/throughput"]
    expr = pytest.importorskip("wandb_workspaces.expr")
    leaves = expr.expr_to_filters(cpu["filters"]).filters
    assert [(f.key.name, f.value) for f in leaves] == [("experiment", EXP.name), ("section", cpu["title"])]
    report = wandb_reports.build(defn, entity="someone")  # the report API's objects, nothing sent
    assert report.title == defn["title"] and len(report.blocks) == 1 + 3 * len(defn["sections"])
