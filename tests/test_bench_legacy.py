"""The one-time conversion of the benchmarks' legacy JSON results: every value lands in a record unchanged, under the
file's machine, with its provenance, and the pages rendered from those records show the legacy figures."""

import json

import pytest

from experiments.benchmarks import host_optim, legacy, overhead, pipeline_vs_torch
from suite.commands.sweep import render
from suite.config.run import RunConfig, apply_overrides
from suite.core.experiment import get_experiment
from suite.measure.machine import fingerprint
from suite.records.index import Index

PROVENANCE = {"commit": "c0ffee" * 6 + "c0ff", "dirty": False, "device": "cpu (x86_64, 2 cores)", "methodology": "1"}


def _write(root, name: str, record: dict) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _host_optim_legacy(machine: dict) -> dict:
    times = {name: [1.0 + i / 10, 1.2 + i / 10] * 10 for i, name in enumerate(host_optim.HEADLINE)}
    times |= {"torch AdamW, fused": [1.0, 1.1] * 10, "triad": [0.5, 0.6] * 10}
    kinds = {**dict.fromkeys(host_optim.HEADLINE, "lamb"), "torch AdamW, fused": "adamw", "triad": "triad"}
    layers = host_optim.model_layers(apply_overrides(RunConfig(), {"model.preset": "tiny"}).validate().model)
    numel = sum(s.numel() for _, s in layers[1])
    m = {"numel": numel, "rounds": 2, "times": host_optim.by_round(times, 2, 10), "kinds": kinds}
    rows = host_optim.summarise(m)
    run = {"size": "layer", "threads": 1, "numel": numel, "rows": rows, "raw": m["times"], "fixed_raw": {}}
    prov = {**PROVENANCE, "profile": "tiny"}
    return {
        "machine": machine,
        "provenance": prov,
        "date": "2026-11-24 07:26 UTC",
        "deepspeed": None,
        "fused_lamb": True,
        "runs": [run],
    }


def _pipeline_legacy() -> dict:
    base = apply_overrides(RunConfig(device="cpu"), pipeline_vs_torch.SHAPE).validate()
    results = {
        pipeline_vs_torch.REFERENCE: {
            "step_time_median_s": 2.0,
            "step_time_min_s": 1.9,
            "step_time_max_s": 2.1,
            "samples_per_s": 32.0,
            "timed_steps": 10,
        }
    }
    for i, name in enumerate(pipeline_vs_torch.OURS + pipeline_vs_torch.PEERS):
        t = 1.0 + i / 100
        results[name] = {
            "step_time_median_s": t,
            "step_time_min_s": t,
            "step_time_max_s": t,
            "samples_per_s": 64 / t,
            "timed_steps": 10,
            "speedup_over_grad_accum": 2.0 / t,
            "max_update_rel_error_vs_grad_accum": 0.0,
            "peer": None,
        }
    setup = dict(
        ranks=2,
        threads_per_rank=1,
        load_average_1min_at_end=1.75,
        cpu_count=2,
        micro_batches=8,
        ideal_speedup=16 / 9,
        rounds=5,
        steps_per_round=2,
    )
    return {"config": base.to_dict(), **setup, "results": results, "provenance": {**PROVENANCE, "profile": "tiny"}}


def test_legacy_results_become_records_with_the_same_values(tmp_path, monkeypatch):
    # Files here are not in git: the commit that wrote a file without a date of its own is given.
    monkeypatch.setattr(legacy, "last_commit", lambda path: ("abc123", "2026-11-21T11:28:44+00:00"))
    machine = fingerprint()
    over = {
        "profile": "tiny",
        "config": overhead.config_text("tiny").split(),
        "layered_step_s": 0.1226,
        "plain_step_s": 0.1291,
        "ratio": 0.949,
        "repeats": 20,
        "provenance": {**PROVENANCE, "profile": "tiny"},
    }
    _write(tmp_path, "overhead/tiny-cpu.json", over)
    hopt = _host_optim_legacy(machine)
    _write(tmp_path, f"host_optim/{machine['slug']}.json", hopt)
    pipe = _pipeline_legacy()
    _write(tmp_path, "pipeline_bench.json", pipe)

    paths = legacy.convert(tmp_path)
    assert len(paths) == 3
    records = {r["experiment"]: r for r in Index(tmp_path).records()}
    # The overhead file predates fingerprints: its record is named by its provenance, as other such records are.
    o = records["bench-overhead"]
    assert paths[0].parent.name == "unfingerprinted-cpu-x86_64-2-cores" and "machine" not in o
    assert (o["metrics"]["layered_step_s"], o["metrics"]["plain_step_s"], o["metrics"]["layered_over_plain"]) == (
        0.1226,
        0.1291,
        0.949,
    )
    assert o["provenance"] == over["provenance"] and o["converted_from"]["file"] == "results/overhead/tiny-cpu.json"
    assert o["finished"] == "2026-11-21T11:28:44+00:00" and o["converted_from"]["commit"] == "abc123"
    assert o["key"] == get_experiment("bench-overhead").cells("tiny", overrides=["device=cpu"])[0].key
    h = records["bench-host-optim"]
    assert h["machine"] == machine and h["row"] == "layer-1-thread" and h["finished"] == "2026-11-24T07:26:00+00:00"
    assert h["metrics"]["candidates"] == hopt["runs"][0]["rows"] and h["metrics"]["raw"] == hopt["runs"][0]["raw"]
    p = records["bench-pipeline"]
    assert [r["run"] for r in p["metrics"]["results"]] == list(pipe["results"])
    assert all(r == {"run": n, **pipe["results"][n]} for r, n in zip(p["metrics"]["results"], pipe["results"]))
    assert p["metrics"]["load_average_1min_at_end"] == 1.75 and p["provenance"]["commit"] == PROVENANCE["commit"]

    for name in ("bench-overhead", "bench-host-optim", "bench-pipeline"):
        render(get_experiment(name), tmp_path, progress=lambda m: None)
    assert "| 0.1226 | 0.1291 | 0.949 |" in (tmp_path / "bench-overhead.md").read_text()
    page = (tmp_path / "bench-host-optim.md").read_text()
    for row in hopt["runs"][0]["rows"]:
        assert "| " + " | ".join(host_optim.candidate_line(row)) + " |" in page
    page = (tmp_path / "bench-pipeline.md").read_text()
    assert "load average 1.75 at the end" in page and "| 2000.0 | 1900.0 | 2100.0 | 32.0 | 1 (reference) |  |" in page


def test_a_legacy_file_that_does_not_match_the_experiment_is_refused(tmp_path):
    pipe = _pipeline_legacy()
    pipe["config"] = {**pipe["config"], "seq_len": 64}  # measured at another shape than the experiment's
    _write(tmp_path, "pipeline_bench.json", pipe)
    with pytest.raises(AssertionError):
        legacy.convert(tmp_path)
    assert not (tmp_path / "runs").exists()
