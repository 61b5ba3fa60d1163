"""The overhead benchmark: its cell through the runner at a tiny size; and (skipped by default) a grad_accum
forward/backward through the layered view against plain Hugging Face, as microbenchmarks."""

import pytest
import torch

from experiments.benchmarks.overhead import PROFILES, detail_line, make_steps
from suite.commands.sweep import sweep
from suite.config.run import RunConfig, apply_overrides
from suite.core.experiment import get_experiment
from suite.core.request import SweepRequest
from suite.records import store

TABLE3_ROWS = ["table3-amp-rc-u1-vs-hf", "table3-amp-rc-u4-vs-hf", "table3-l2l-cmp-u1-vs-hf", "table3-l2l-cmp-u4-vs-hf"]


@pytest.mark.slow  # make test-slow: about 70 s on 2 cores (7 cells, a process each); make bench-overhead runs them
def test_the_cell_runs_through_the_runner_and_renders(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_MACHINE", "test-machine")
    exp = get_experiment("bench-overhead")
    overrides = ["steps=2", "warmup=1", "seq_len=16", "rounds=3"]
    req = SweepRequest(exp, "tiny", overrides=overrides, results_dir=tmp_path, wandb_mode="off")
    rec, *steps = sweep(req, progress=lambda m: None)
    m = rec["metrics"]
    assert rec["status"] == "ok" and m["repeats"] == 2 and m["layered_step_s"] > 0 and m["plain_step_s"] > 0
    assert m["layered_over_plain"] == pytest.approx(m["layered_step_s"] / m["plain_step_s"])
    assert store.run_path(tmp_path, rec["key"], "test-machine").exists() and rec["provenance"]["torch"]
    page = (tmp_path / "bench-overhead.md").read_text()
    assert "## tiny profile on test-machine (cpu device), set steps=2, set warmup=1, set seq_len=16" in page
    assert f"| {m['layered_step_s']:.4f} | {m['plain_step_s']:.4f} | {m['layered_over_plain']:.3f} | — | — |" in page
    # The whole steps, grad_accum in FP32 and amp in bf16 (on a CPU), against the plain loop in interleaved rounds;
    # then Table 3's AMP-recompute and L2L-CMP rows against a user's loop
    assert [(r["row"], r["config"]["run"]["precision"]) for r in steps] == [
        ("grad_accum-vs-hf", "fp32"),
        ("amp-vs-hf", "bf16"),
        *[(name, "bf16") for name in TABLE3_ROWS],
    ]
    for r in steps:
        s = r["metrics"]
        assert r["status"] == "ok" and s["rounds"] == 3 and len(s["ratio_rounds"]) == 3
        assert s["ratio_min"] <= s["layered_over_plain"] <= s["ratio_max"]
        assert s["layered_over_plain"] == pytest.approx(sorted(s["ratio_rounds"])[1])
        assert f"| {s['ratio_min']:.3f} | {s['ratio_max']:.3f} |" in page
        assert "| " + " | ".join(detail_line(r["row"], s)) + " |" in page


def _steps_alike(run, user: bool):
    """Two steps of the suite's method and of the plain loop on the same weights: the same losses, and the same
    weights after (but those whose gradient is zero in exact arithmetic). Returns the plain loop's step."""
    from experiments.benchmarks.overhead import plain_loop
    from suite.core.check import build_method, relative_error
    from suite.harness.data import synthetic_batches

    method = build_method(run.validate(), torch.device("cpu"))
    plain = plain_loop(method.model, run, torch.device("cpu"), user=user)
    batches = synthetic_batches(run, padded=True)
    for _ in range(2):
        batch = next(batches)
        assert method.step(batch).loss == pytest.approx(plain(batch), rel=1e-5)
    ours = dict(method.model.hf.named_parameters())
    for name, p in plain.model.named_parameters():
        if name not in method.model.gradient_free():
            assert relative_error(p.detach(), ours[name].detach()) < 1e-5, name
    return plain


def test_the_plain_loop_trains_the_same_model_as_grad_accum_without_dropout():
    """The comparison is fair: with dropout off (the one thing the two draw differently), two steps of the plain loop
    move the weights as two of the suite's grad_accum do, its one optimizer matching the per-layer ones."""
    from suite.config.run import ModelConfig

    run = RunConfig(model=ModelConfig(dropout=0.0, attention_dropout=0.0), micro_batch_size=2, num_micro_batches=2)
    _steps_alike(run, user=False)


def test_the_table3_rows_take_table3s_options_at_its_shape():
    """At `paper`, each row is Table 3's amp-rc-u* or l2l-cmp-u* cell (BERT-Large, 64 x 512, fp16, LAMB, its method
    options) but for the device cap (both sides share the device) and the benchmark's own timing settings; the
    earlier rows take no `plain` setting, so their cell keys stay as they were."""
    ours = {c.row.name: c.run.to_dict() for c in get_experiment("bench-overhead").cells("paper")}
    table3 = {c.row.name: c.run.to_dict() for c in get_experiment("table3").cells("paper")}
    own = {"compare", "rounds", "plain"}
    for name in TABLE3_ROWS:
        theirs = table3[name.removeprefix("table3-").removesuffix("-vs-hf")]
        run = ours[name]
        assert run["options"]["plain"] == "user" and run["options"]["compare"] == "step"
        assert {k: v for k, v in run["options"].items() if k not in own} == theirs["options"]
        skip = {"options", "device_memory", "warmup", "steps"}
        assert {k: v for k, v in run.items() if k not in skip} == {k: v for k, v in theirs.items() if k not in skip}
        assert (run["micro_batch_size"], run["precision"], run["optimizer"]) == (64, "fp16", "lamb")
        assert run["model"]["preset"] == "bert-large" and run["seq_len"] == 512 and run["options"]["rounds"] >= 3
        assert run["steps"] >= 5  # enough samples: 5 timed steps a round, 3 rounds (issue 51, item 6)
    assert all("plain" not in ours[n]["options"] for n in ("layered-vs-plain", "grad_accum-vs-hf", "amp-vs-hf"))


TINY = ["device=cpu", "steps=1", "warmup=1", "rounds=3", "seq_len=16", "micro_batch_size=2"]


@pytest.mark.parametrize("name", TABLE3_ROWS)
def test_a_table3_row_runs_at_tiny_against_a_users_loop(name):
    """Each new row's cell on a CPU (a second or two): both sides' samples/s, the ratio and its spread over the
    rounds, the memory keys (None on a CPU), what each side runs; its line of the detail table."""
    from experiments.benchmarks.overhead import overhead_cell

    (cell,) = get_experiment("bench-overhead").cells("tiny", only=[name], overrides=TINY)
    m = overhead_cell(cell.run, torch.device("cpu"), None)
    assert m["layered_samples_per_s"] > 0 and m["plain_samples_per_s"] > 0 and m["rounds"] == 3
    assert len(m["ratio_rounds"]) == 3 and m["ratio_min"] <= m["layered_over_plain"] <= m["ratio_max"]
    assert m["layered_over_plain"] == pytest.approx(sorted(m["ratio_rounds"])[1])
    for key in ("peak_gb", "resident_gb", "peak_in_process_gb"):
        assert m[f"layered_{key}"] is None and m[f"plain_{key}"] is None
    assert m["peak_ratio"] is None and m["memory_kind"] is None and "layered_mfu" not in m
    assert m["layered_skipped_steps"] == m["plain_skipped_steps"] == 0  # bf16: no loss scaler on either side
    assert m["layered_method"] == cell.run.method and m["layered_recompute"] and m["plain_checkpointing"]
    assert m["layered_optimizer"].startswith("LAMB (the suite's") and m["plain_optimizer"].startswith("AdamW (torch")
    assert m["layered_attention"].startswith("suite_keyed") and m["plain_attention"] == "sdpa"
    line = detail_line(name, m)
    assert line[0] == f"`{name}`" and line[6:9] == ["—", "—", "—"]


def test_the_users_loop_trains_the_same_model_as_grad_accum_with_adamw_and_recompute():
    """The user's loop (torch's fused AdamW over the model, its checkpointing) takes the suite's steps: with dropout
    off, two steps move the weights as grad_accum's per-layer AdamW recomputing each block does."""
    from suite.config.run import ModelConfig

    run = RunConfig(
        model=ModelConfig(dropout=0.0, attention_dropout=0.0),
        micro_batch_size=2,
        num_micro_batches=2,
        optimizer="adamw",
        options={"recompute": "on"},
    )
    plain = _steps_alike(run, user=True)
    assert plain.checkpointing and plain.optimizer.startswith("AdamW (torch") and plain.attention == "sdpa"


def test_each_sides_peak_is_its_own_less_the_other_sides_resident_bytes(monkeypatch):
    """Residency's arithmetic on a fake CUDA allocator: a side's peak is the allocator's peak during its block less
    what the other side keeps resident, its resident bytes what it adds and keeps."""
    from experiments.benchmarks import overhead

    mem = {"now": 100, "peak": 100}
    monkeypatch.setattr(overhead, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: mem["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: mem["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: mem.update(peak=mem["now"]))

    def run(transient: int, keeps: int):  # a block: a transient peak, then what stays allocated after it
        mem["peak"] = max(mem["peak"], mem["now"] + transient)
        mem["now"] += keeps

    r = overhead.Residency(torch.device("cuda"))
    mem["now"] += 50  # the suite side built: 50 resident
    r.settled("layered")
    mem["now"] += 30  # the plain side built
    r.settled("plain")
    assert r.resident == {"layered": 50, "plain": 30}
    for side, transient, keeps in (("layered", 70, 5), ("plain", 200, 20), ("layered", 60, 0), ("plain", 10, 0)):
        r.start()
        run(transient, keeps)
        r.end(side)
        r.settled(side)
    assert r.resident == {"layered": 55, "plain": 50}
    # Own: layered 50 + 70 in its first block (the plain's 30 beside; 115 in its second), plain 30 + 200 (the
    # suite's 55 beside). Raw: the layered side's second block, 55 + 60 beside the plain's 50, is its largest.
    assert r.peak == {"layered": 120, "plain": 230} and r.raw == {"layered": 165, "plain": 285}
    m = r.metrics()
    assert m["layered_peak_gb"] == 120 / 1e9 and m["peak_ratio"] == pytest.approx(120 / 230)
    assert m["plain_peak_in_process_gb"] == 285 / 1e9 and m["memory_kind"].startswith("cuda max_memory_allocated")


@pytest.fixture(scope="module")
def steps():
    run = apply_overrides(RunConfig(), PROFILES["tiny"]).validate()
    return make_steps(run, torch.device("cpu"))


def test_bench_layered_step(benchmark, steps):
    benchmark.group = "layered view vs plain HF"
    benchmark(steps[0])


def test_bench_plain_hf_step(benchmark, steps):
    benchmark.group = "layered view vs plain HF"
    benchmark(steps[1])
