"""The decoder experiments: their rows expand at Llama's shapes, and the largest-model search stops where the host
or the device runs out."""

import pytest

from experiments import decoder, decoder_batch, decoder_largest
from suite.config.run import ModelConfig, RunConfig
from suite.core.plan import counted


def test_the_decoder_table_counts_every_size_method_and_stage():
    cells = counted(decoder.EXPERIMENT.cells("paper", ["*-80GB"], None, None, counting=True))
    assert {c.run.model.preset for c in cells} == set(decoder.SIZES)
    assert all(c.kind == "count" and c.run.seq_len == 4096 and c.run.device_memory == "80GB" for c in cells)
    stages = {(c.run.method, c.run.options.get("stages")) for c in cells if "d8" in c.row.name}
    assert stages == {("gpipe", 8), ("pipedream-flush", 8), ("pipedream-2bw", 8)}


@pytest.mark.slow  # make test-slow: every count of the search in a fresh process, about 6 s each
@pytest.mark.parametrize("host", ["1MiB", "8MiB"])
def test_the_largest_model_is_the_deepest_whose_host_and_device_hold(host):
    run = RunConfig(
        method="l2l-cmp",
        precision="bf16",
        device="cpu",
        model=ModelConfig(preset="llama-tiny"),
        seq_len=16,
        micro_batch_size=1,
        num_micro_batches=1,
        device_memory="1GB",
        options={"stash": "cpu", "overlap": "on", "projection": {"host": host}},
    )
    try:
        m = decoder_largest.largest(run, None, None)
    except Exception as exc:  # a host too small for a single block (the embeddings and head alone take 2.6 MB)
        assert "not even one block fits" in str(exc) and host == "1MiB"
        return
    assert host == "8MiB"
    n, searched = m["max_layers"], m["searched"]
    assert m["host_peak_bytes"] <= 8 * 2**20 and str(n + 1) in searched
    assert "host" in searched[str(n + 1)] and m["max_params_billion"] > 0


def test_the_8b_table_runs_each_method_at_both_shapes_and_the_truncated_pair():
    """decoder-8b (issue 54): Llama 3 8B and Llama 2 7B's shape at 16 sequences of 4096 tokens under L2L-CMP (two
    slots, every block resident, LAMB), FSDP2's offload and AMP resident, and the 8-layer pair AMP fits; at `tiny`
    the same rows on llama-tiny shapes."""
    from experiments import decoder_8b

    paper = {c.row.name: c.run for c in decoder_8b.EXPERIMENT.cells("paper")}
    assert {r.model.preset for r in paper.values()} == {"llama-8b", "llama2-7b"}
    assert all(r.seq_len == 4096 and r.batch_size == 16 and r.device_memory == "80GB" for r in paper.values())
    assert paper["8b-l2l-cmp-cache"].options["block_slots"] == 32 and "block_slots" not in paper["8b-l2l-cmp"].options
    assert paper["7b-l2l-cmp-lamb"].optimizer == "lamb" and paper["8b-fsdp"].method == "fsdp-offload"
    assert paper["8b-8l-amp"].model.layers == paper["8b-8l-l2l-cmp-cache"].options["block_slots"] == 8
    assert paper["7b-amp"].model.resolved().kv_heads is None  # multi-head attention
    assert {r.model.init for r in paper.values()} == {"hf"}  # half the build's draws
    tiny = {c.row.name for c in decoder_8b.EXPERIMENT.cells("tiny")}
    assert tiny == set(paper) - {"8b-8l-amp", "8b-8l-l2l-cmp-cache"} | {"8b-2l-amp", "8b-2l-l2l-cmp-cache"}


def test_the_search_starts_where_two_counts_in_a_line_meet_a_cap():
    # Device 10 + 3 a unit, host 100 + 50 a unit: a device of 100 holds 31 (10 + 3 * 30), a host of 1000 holds 19.
    counted = []

    def count(n):
        counted.append(n)
        return {"device_peak_allocated": 10 + 3 * (n - 1), "host_peak_bytes": 100 + 50 * (n - 1)}

    assert decoder_largest.affine_guess(count, 100, 10**6) == 31
    assert decoder_largest.affine_guess(count, 100, 1000) == 19
    assert decoder_largest.affine_guess(count, 10**12, 10**12) == decoder_largest.MOST
    assert decoder_largest.affine_guess(lambda n: {"oom": "x"} if n == 2 else count(n), 100, 1000) == 1
    assert counted[:2] == [1, 2]


def test_a_search_over_anything_but_depth_or_micro_batch_is_refused():
    projection = {"host": "1GiB", "over": "heads"}
    run = RunConfig(method="l2l", model=ModelConfig(preset="llama-tiny"), options={"projection": projection})
    with pytest.raises(Exception, match="micro_batch_size"):
        decoder_largest.largest(run, None, None)


def test_the_batch_table_searches_the_micro_batch_at_every_size_and_sequence():
    cells = decoder_batch.EXPERIMENT.cells("paper", None, None, None)
    assert {(c.run.model.preset, c.run.seq_len) for c in cells} == {(s, q) for s in decoder.SIZES for q in (4096, 8192)}
    assert all(c.kind == "decoder-largest" and c.run.options["projection"]["over"] == "micro_batch_size" for c in cells)
    assert {c.run.method for c in cells} == {"grad_accum", "amp", "l2l", "l2l-cmp"}


@pytest.mark.slow  # make test-slow: a count in a fresh process each, about 6 s
def test_the_largest_micro_batch_is_the_one_whose_next_does_not_hold():
    run = RunConfig(
        method="amp",
        precision="bf16",
        device="cpu",
        model=ModelConfig(preset="llama-tiny"),
        seq_len=32,
        micro_batch_size=1,
        num_micro_batches=1,
        device_memory="6MB",
        options={"recompute": "on", "projection": {"host": "1GiB", "over": "micro_batch_size"}},
    )
    m = decoder_largest.largest(run, None, None)
    n, searched = m["max_micro_batch"], m["searched"]
    assert n >= 1 and searched[str(n + 1)] == "device oom" and m["memory_gb"] * 1e9 <= 6e6
    assert m["tokens_per_micro_batch"] == 32 * n


def test_an_8b_cell_measures_its_rounds_in_the_process_that_built_its_model(monkeypatch):
    """Llama 3 8B's FP32 build takes minutes of the host's serial generator, and the host holds one copy of it: each
    timed decoder-8b cell builds its model once and measures its three rounds of two steps there, each round its
    own figure in the record (the sweep's merge keeps them apart, and adds another process's rounds to them)."""
    import torch

    from experiments import decoder_8b
    from suite.core import check
    from suite.core.cell import throughput_rounds_cell
    from suite.core.rounds import merge

    (cell,) = decoder_8b.EXPERIMENT.cells("tiny", ["8b-2l-amp"], ["steps=1"])
    assert cell.kind == "throughput-rounds" and cell.run.options["rounds_inside"] == decoder_8b.ROUNDS == 3
    assert {c.kind for c in decoder_8b.EXPERIMENT.cells("paper")} == {"throughput-rounds"}
    builds, build = [], check.build_method
    monkeypatch.setattr(check, "build_method", lambda *a: builds.append(1) or build(*a))
    m = throughput_rounds_cell(cell.run, torch.device("cpu"), None)
    assert len(builds) == 1 and len(m["throughput_rounds"]) == 3 and m["timed_steps"] == 3
    assert min(m["throughput_rounds"]) <= m["throughput"] <= max(m["throughput_rounds"])
    one = {"status": "ok", "metrics": m, "provenance": {"code": "x"}}
    assert merge([one], 1)["rounds"] == 3 and merge([one], 1)["metrics"]["throughput_rounds"] == m["throughput_rounds"]
    assert merge([one, one], 2)["rounds"] == 6
    ranks = {**one, "metrics": {**m, "throughput_per_rank": 1.0, "throughput_per_rank_rounds": [0.5, 1.0, 1.5]}}
    assert "throughput_per_rank_rounds" not in merge([ranks, one], 2)["metrics"]  # no spread of some rounds only
