"""The host optimizer benchmark runs end to end at a small size and writes its table (speed is not tested)."""

import json

import pytest
import torch

from experiments.benchmarks import host_optim


def test_measures_every_candidate_and_renders(tmp_path):
    layers = host_optim.make_params([[("w", torch.Size([64, 32])), ("b", torch.Size([32]))]])
    m = host_optim.measure(layers, threads=1, rounds=2, steps=2, deepspeed=False)
    rows = host_optim.summarise(m)
    names = [r["name"] for r in rows]
    assert names[:2] == ["suite LAMB, fused (L2L's host)", "suite LAMB, foreach (before)"] and names[-1] == "triad"
    assert all(r["samples"] == 4 and r["ns_per_param"] > 0 for r in rows)
    fused = next(r for r in rows if r["name"] == "torch AdamW, fused")
    assert fused["ratio"] == pytest.approx(1.0) and fused["ratio_to"] == "torch AdamW, fused"
    # Each update's fixed cost per step, timed on one-element tensors of the same structure; the triad has none.
    assert all((r["fixed_us"] is None) == (r["kind"] == "triad") for r in rows)
    assert all(r["fixed_us"] > 0 and r["fixed_share"] > 0 for r in rows if r["kind"] != "triad")
    assert len(m["fixed"]["suite AdamW, fused (L2L's host)"]) == 4
    record = {
        "machine": host_optim.fingerprint(),
        "provenance": {"commit": "abc1234", "dirty": False},
        "date": "today",
        "deepspeed": None,
        "fused_lamb": True,
        "runs": [{"size": "model", "threads": 1, "numel": m["numel"], "rows": rows}],
    }
    (tmp_path / "host_optim").mkdir()
    (tmp_path / "host_optim" / "x.json").write_text(json.dumps(record))
    text = host_optim.render(tmp_path)
    assert "| suite LAMB, fused (L2L's host) |" in text and "projected share" in text
    assert "| fixed µs/step (share) |" in text and text.count(" | — |\n") == 1  # only the triad has no fixed cost
    assert "DeepSpeed not installed" in text


def test_bad_sizes_are_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        host_optim.main(["--sizes", "layer,huge"])
    assert "--sizes: ['huge'] is not among ['layer', 'model']" in capsys.readouterr().err


def test_l2l_host_step_measures_four_variants(monkeypatch, tmp_path):
    from experiments.benchmarks import l2l_host_step
    from suite.config.run import ModelConfig

    monkeypatch.setitem(
        l2l_host_step.SHAPES,
        "cpu",
        dict(model=ModelConfig(preset="tiny"), seq_len=16, micro_batch_size=2, precision="fp32"),
    )
    m = l2l_host_step.measure(torch.device("cpu"), rounds=1, steps=1)
    summary = l2l_host_step.summarise(m)
    assert [(r["host_optim"], r["overlap"]) for r in summary["rows"]] == l2l_host_step.VARIANTS
    assert all(r["step_s"] > 0 and r["host_s"] > 0 for r in summary["rows"])
    assert set(summary["hidden"]) == {"foreach", "fused"}


def test_ratios_are_taken_round_by_round():
    # Two rounds of two steps each, stored round after round as measure() collects them: the machine is twice as
    # slow in round 2, for everyone. Per-round ratios stay 2.0; unpaired medians would not see the pairing.
    times = {"suite LAMB, fused (L2L's host)": [2, 2, 8, 8], "torch AdamW, fused": [1, 1, 4, 4], "triad": [1, 1, 1, 1]}
    rounds, steps = 2, 2
    regrouped = host_optim.by_round(times, rounds, steps)
    kinds = {"suite LAMB, fused (L2L's host)": "lamb", "torch AdamW, fused": "adamw", "triad": "triad"}
    m = {"numel": 10**9, "rounds": rounds, "times": regrouped, "kinds": kinds}
    rows = {r["name"]: r for r in host_optim.summarise(m)}
    lamb = rows["suite LAMB, fused (L2L's host)"]
    assert (lamb["ratio"], lamb["ratio_min"], lamb["ratio_max"]) == (2.0, 2.0, 2.0)
    assert lamb["ns_per_param"] == 5.0 and lamb["target"] == 1.6 and rows["triad"]["ratio"] is None


def test_the_reference_is_chosen_once_not_round_by_round():
    # Two rounds of two steps, stored round after round. torch's fused AdamW takes 1.0 then 1.2 s, DeepSpeed's 1.4
    # then 1.0: torch has the lower median over the run (1.1 against 1.2), so it is the reference in both rounds
    # and its own ratio is 1.0 in each. A per-round minimum would make it 1.2x in round 2, its own reference's
    # noise counted against it.
    times = {
        "torch AdamW, fused": [1.0, 1.0, 1.2, 1.2],
        "DeepSpeed CPU Adam (AdamW mode)": [1.4, 1.4, 1.0, 1.0],
        "suite AdamW, fused (L2L's host)": [1.1, 1.1, 1.1, 1.1],
    }
    rounds, steps = 2, 2
    kinds = dict.fromkeys(times, "adamw")
    m = {"numel": 10**9, "rounds": rounds, "times": host_optim.by_round(times, rounds, steps), "kinds": kinds}
    rows = {r["name"]: r for r in host_optim.summarise(m)}
    torch_row = rows["torch AdamW, fused"]
    assert (torch_row["ratio"], torch_row["ratio_min"], torch_row["ratio_max"]) == (1.0, 1.0, 1.0)
    assert rows["suite AdamW, fused (L2L's host)"]["ratio_to"] == "torch AdamW, fused"
    assert rows["DeepSpeed CPU Adam (AdamW mode)"]["ratio_max"] == 1.4
