"""The decoder experiments: their rows expand at Llama's shapes, and the largest-model search stops where the host
or the device runs out."""

import pytest

from experiments import decoder, decoder_largest
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
