"""torch.distributed.pipelining's schedules as peers: registered, listed, checked against grad_accum on 2 gloo ranks."""

import re
import subprocess
from pathlib import Path

import pytest

from methods.peers.torch_pipelining import gloo_mixes_p2p
from methods.pipeline.executors.torchrun import torchrun
from suite.config.errors import ConfigError
from suite.config.run import RunConfig, apply_overrides
from suite.core import registry

# torch's schedules as the method catalogue lists them (registry.METHODS: the module that registers each).
PEERS = [n for n in registry.METHODS.names() if registry.METHODS.entry(n).where == "methods.peers.torch_pipelining"]
TINY = ["device=cpu", "model.layers=2", "model.hidden=32", "model.heads=2", "model.intermediate=64", "seq_len=8"]
TIMEOUT = 300


def _check(methods, extra=()):
    args = [x for m in methods for x in ("--method", m)] + ["--steps", "3"]
    args += [x for s in [*TINY, "num_micro_batches=4", "micro_batch_size=2", *extra] for x in ("--set", s)]
    try:
        return torchrun(2, "methods.peers.dist_check", args, TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{methods} did not finish within {TIMEOUT} s (hang)")


def test_peers_are_registered_and_marked():
    for name in PEERS:
        cls = registry.get(name)
        assert cls.peer == "torch.distributed.pipelining"
        assert not cls.shards_batch and cls.dist_check_module == "methods.peers.dist_check"
    assert registry.get("gpipe").peer is None  # ours are not peers


def test_every_schedule_matches_grad_accum_on_two_ranks():
    """Dropout on, 4 micro-batches over 2 ranks (4 stages where a rank holds 2). Summed in micro-batch order, the
    gradients are grad_accum's bits; LoopedBFS runs the backwards in reverse order, so only its sums differ."""
    # torch 2.11's gloo (the GPU image's torch, mimicked on CPU) fails the V schedules' mixed p2p batches.
    peers = PEERS if gloo_mixes_p2p() else [p for p in PEERS if registry.get(p).placement != "v"]
    proc = _check(peers)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert f"{len(peers)} of {len(peers)} passed" in out, out
    reports = re.findall(r"check (\S+) on 2 ranks.*?\n(?:.*\n)*?PASS: largest (\S+)", out)
    assert [name for name, _ in reports] == peers, out
    for name, largest in reports:
        if name == "torch-looped-bfs":
            assert 0.0 < float(largest) <= 1e-5
        else:
            assert float(largest) == 0.0, (name, largest)


def test_the_oracle_catches_a_peer_that_scales_twice(monkeypatch):
    monkeypatch.setenv("SUITE_PLUGINS", "plugin_methods")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))
    proc = _check(["torch-gpipe-double-scaled"])
    assert proc.returncode != 0
    assert "FAIL: largest" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize(
    "name,sets,needle",
    [
        ("torch-dualpipev", ["num_micro_batches=2"], "num_micro_batches >= its 4 stages"),
        ("torch-1f1b", ["stages=4", "num_micro_batches=2"], "num_micro_batches >= its 4 stages"),
        ("torch-interleaved-1f1b", ["stages=2", "num_micro_batches=5"], "multiple of its rounds"),
        ("torch-zbv", ["stages=3", "model.layers=2"], "choose stages <= 2"),
        ("torch-gpipe", ["ranks=2"], "keep ranks=1"),
    ],
)
def test_bad_configurations_fail_in_one_line_before_launch(name, sets, needle):
    cls = registry.get(name)
    run = apply_overrides(RunConfig(method=name), sets, cls.options).validate()
    with pytest.raises(ConfigError, match=re.escape(needle)):
        cls.check_config(run)


@pytest.mark.slow  # make test-slow; the default run checks every schedule once
def test_clipping_across_ranks_under_a_schedule():
    """The squared norms of both ranks' stages summed before the clip, under a warm-up then decay."""
    extra = ["clip_grad_norm=0.1", "schedule=linear", "warmup_steps=1", "total_steps=3"]
    proc = _check(["torch-1f1b", "torch-zbv" if gloo_mixes_p2p() else "torch-zero-bubble"], extra=extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "2 of 2 passed" in proc.stdout


@pytest.mark.slow  # make test-slow; the default run checks every schedule once
def test_recompute_keeps_the_bits():
    """Every block checkpointed (keyed dropout masks): the zero-bubble split of the backward as well."""
    peers = ["torch-1f1b", "torch-zero-bubble"]
    proc = _check(peers, extra=["recompute=true"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("PASS: largest 0.000e+00") == len(peers), proc.stdout
