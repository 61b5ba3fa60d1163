"""FSDP2 and DeepSpeed ZeRO as peers: registered, checked against grad_accum on one rank and on 2 gloo ranks."""

import dataclasses
import importlib.util
import re
import subprocess
import sys

import pytest

from methods.pipeline.executors.torchrun import torchrun
from suite.config.errors import ConfigError
from suite.config.paths import ROOT
from suite.config.run import RunConfig, apply_overrides
from suite.core import registry

# On the CPU wherever the tests run: the bitwise claims are gloo's and the CPU kernels'.
TINY = ["device=cpu", "model.layers=2", "model.hidden=32", "model.heads=2", "model.intermediate=64", "seq_len=8"]
# A step that clips (the tiny model's gradient norm is above 0.1) under a warm-up then decay: the LR schedule and
# the clip each peer applies itself (DeepSpeed's own clipping, FSDP2's over DTensors) meet the oracle too.
CLIP_AND_SCHEDULE = ["clip_grad_norm=0.1", "schedule=linear", "warmup_steps=1", "total_steps=3"]
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is an optional extra ('.[peers]')")
TIMEOUT = 400  # DeepSpeed's first use on a machine builds its CPU ops (about 2 minutes)


def _largest(out: str, name: str) -> float:
    m = re.search(rf"check {re.escape(name)} .*?\n(?:.*\n)*?(PASS|FAIL): largest (\S+)", out)
    assert m, out
    return float(m.group(2))


def _one_rank(name: str, *sets: str, against: str = "grad_accum") -> subprocess.CompletedProcess:
    """`suite check` in a process of its own: the peer joins a process group, which must not outlive the test."""
    args = [x for s in [*TINY, "num_micro_batches=4", *sets] for x in ("--set", s)]
    cmd = [sys.executable, "-m", "suite", "check", name, "--against", against, "--steps", "3", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT)


def _two_ranks(names: list[str], *sets: str) -> subprocess.CompletedProcess:
    args = [x for n in names for x in ("--method", n)] + ["--steps", "3"]
    args += [x for s in [*TINY, "num_micro_batches=4", "micro_batch_size=4", *sets] for x in ("--set", s)]
    return torchrun(2, "methods.peers.dist_check", args, TIMEOUT)


def test_peers_are_registered_as_data_parallel():
    for name, lib in [("fsdp-offload", "FSDP2"), ("deepspeed-offload", "ZeRO"), ("deepspeed-infinity", "ZeRO")]:
        cls = registry.get(name)
        assert lib in cls.peer and cls.shards_batch and cls.dist_check_module == "methods.peers.dist_check"


@pytest.mark.slow  # make test-slow; the default run checks every peer once
def test_fsdp_on_one_rank_matches_grad_accum_bitwise_with_adamw():
    proc = _one_rank("fsdp-offload", "optimizer=adamw")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "fsdp-offload") == 0.0


@pytest.mark.slow  # make test-slow; the default run checks FSDP2 on two ranks with AdamW (recompute on)
def test_fsdp_with_lamb_on_two_ranks_within_the_bound():
    """LAMB's trust ratio over FSDP2's shards takes torch's foreach path on DTensors (norms all-reduced), not the
    fused kernel, and the ranks' sums come in another order: within 1e-5, not bitwise."""
    proc = _two_ranks(["fsdp-offload"], *CLIP_AND_SCHEDULE)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "fsdp-offload") <= 1e-5


@pytest.mark.slow  # make test-slow (36 s); the default run checks ZeRO-Offload on two ranks
@needs_deepspeed
def test_zero_offload_on_one_rank_matches_grad_accum_bitwise_with_lamb():
    """One group per tensor, so ZeRO's flat groups are whole tensors and the suite's fused LAMB steps them."""
    proc = _one_rank("deepspeed-offload")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "deepspeed-offload") == 0.0


@pytest.mark.slow  # make test-slow (about 40 s); the default run checks ZeRO-Offload on two ranks
@needs_deepspeed
def test_zero_offload_in_bf16_is_amp_on_one_rank():
    """DeepSpeed's `torch_autocast` keeps FP32 weights and computes under bf16 autocast, as the suite's AMP does:
    on one rank, with LAMB per tensor, the same weights bit for bit."""
    proc = _one_rank("deepspeed-offload", "precision=bf16", against="amp")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "deepspeed-offload") == 0.0


@pytest.mark.slow  # make test-slow; the default run checks every peer once
@needs_deepspeed
def test_zero_3_on_one_rank_with_lamb_within_the_bound():
    """The combination Tables 2 and 5 run: stage 3, parameters offloaded, the suite's LAMB per tensor."""
    proc = _one_rank("deepspeed-infinity", *CLIP_AND_SCHEDULE)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "deepspeed-infinity") <= 1e-5


@needs_deepspeed
@pytest.mark.parametrize(
    "recompute",
    [
        "on",  # each block checkpointed, as Tables 2, 3 and 5 run them: the libraries' hooks gather it again
        pytest.param("off", marks=pytest.mark.slow),  # make test-slow, as the one-rank checks above
    ],
)
def test_data_parallel_peers_on_two_ranks_match_grad_accum(recompute):
    names = ["fsdp-offload", "deepspeed-offload", "deepspeed-infinity"]
    proc = _two_ranks(names, "optimizer=adamw", f"recompute={recompute}", *CLIP_AND_SCHEDULE)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "3 of 3 passed" in proc.stdout
    for name in names:
        assert _largest(proc.stdout, name) <= 1e-5


@needs_deepspeed
@pytest.mark.slow  # make test-slow (36 s: DeepSpeed's CPU Adam op); the default run checks ZeRO-Offload's step
def test_deepspeed_cpu_adam_is_torch_adamw_up_to_rounding():
    """DeepSpeed's own CPU Adam rounds differently from torch's AdamW (the update-relative check over 3 steps reads
    1.8e-5, past 1e-5), so the engine is checked with torch's AdamW and this kernel against torch's directly: one
    step from the same state lands within 4 float32 epsilons of max(|w|, lr) per element."""
    import os

    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    w = torch.randn(4096)
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    ours = DeepSpeedCPUAdam([a], adamw_mode=True, fp32_optimizer_states=True, **hyper)
    torchs = torch.optim.AdamW([b], fused=True, **hyper)
    g = torch.randn(4096)
    a.grad, b.grad = g.clone(), g.clone()
    ours.step()
    torchs.step()
    scale = torch.finfo(torch.float32).eps * (w.abs() + hyper["lr"])
    ratio = ((a.detach() - b.detach()).abs() / scale).max().item()
    assert ratio <= 4.0
    assert not torch.equal(a.detach(), w)  # it did step


@pytest.mark.parametrize(
    "name,sets,needle",
    [
        ("deepspeed-offload", ["ranks=2", "micro_batch_size=4"], "optimizer=lamb on one rank only"),
        ("fsdp-offload", ["micro_batch_size=3", "ranks=2"], "multiple of ranks"),
        ("deepspeed-offload", ["host_adam=deepspeed"], "host_adam=deepspeed is an AdamW kernel"),
    ],
)
def test_bad_configurations_fail_in_one_line(name, sets, needle, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: object())  # as if DeepSpeed were installed
    cls = registry.get(name)
    run = apply_overrides(RunConfig(method=name), sets, cls.options).validate()
    with pytest.raises(ConfigError, match=re.escape(needle)):
        cls.check_config(run)


def test_without_deepspeed_the_error_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deepspeed" else real(n, *a))
    run = RunConfig(method="deepspeed-offload").validate()
    with pytest.raises(ConfigError, match=r"cannot run here: DeepSpeed is not installed: DS_BUILD_OPS=0 pip install"):
        registry.get("deepspeed-offload").check_config(run)


def test_without_deepspeed_a_sweep_records_its_rows_and_runs_the_rest(tmp_path, monkeypatch):
    """The GPU image has no DeepSpeed: Table 2's ZeRO rows are recorded not_implemented with the reason, and the
    sweep goes on (counted here, to stay quick)."""
    from suite.commands.sweep import sweep
    from suite.core.experiment import get_experiment
    from suite.core.request import SweepRequest

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deepspeed" else real(n, *a))
    monkeypatch.setenv("SUITE_MACHINE", "counter")
    exp = get_experiment("table2")
    rows = ["baseline-fp32", "peer-zero-offload-fp32"]
    records = sweep(
        SweepRequest(exp, "tiny", rows, results_dir=tmp_path, wandb_mode="off", measure="count"),
        progress=lambda m: None,
    )
    by_row = {r["row"]: r for r in records}
    assert by_row["baseline-fp32"]["status"] == "ok"
    zero = by_row["peer-zero-offload-fp32"]
    assert zero["status"] == "not_implemented" and zero["error"].startswith("unavailable here: DeepSpeed is not")


def test_a_count_records_uncountable_peers_with_the_reason_and_counts_fsdp(tmp_path, monkeypatch):
    """Table 5's peers at tiny under a count: FSDP2 counted (a fake one-rank group), ZeRO-3 recorded
    not_implemented with the reason, before any process starts (no DeepSpeed needed)."""
    from suite.commands.sweep import sweep
    from suite.core.experiment import get_experiment
    from suite.core.request import SweepRequest

    monkeypatch.setenv("SUITE_MACHINE", "counter")
    exp = get_experiment("table5")
    rows = ["peer-fsdp-x1", "peer-zero-infinity-x1"]
    records = sweep(
        SweepRequest(exp, "tiny", rows, results_dir=tmp_path, wandb_mode="off", measure="count"),
        progress=lambda m: None,
    )
    by_row = {r["row"]: r for r in records}
    # without offload in a count, FSDP2 at one rank holds what grad_accum holds: past the 10 MiB cap at 64 samples
    assert by_row["peer-fsdp-x1"]["status"] == "oom", by_row["peer-fsdp-x1"].get("error", "")[-2000:]
    zero = by_row["peer-zero-infinity-x1"]
    why = "not counted: DeepSpeed's engine" if HAS_DEEPSPEED else "unavailable here: DeepSpeed is not installed"
    assert zero["status"] == "not_implemented" and zero["error"].startswith(why)


@pytest.mark.slow  # make test-slow; the default run checks every peer once
def test_fsdp_in_bf16_trains_as_l2l_cmp_does():
    """16-bit weights in the compute over FP32 shards, gradients reduced in FP32: CMP's arithmetic, so the same
    distance from FP32 grad_accum as l2l-cmp's, inside the 16-bit bound."""
    got = {}
    for name in ("fsdp-offload", "l2l-cmp"):
        proc = _one_rank(name, "precision=bf16")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        got[name] = _largest(proc.stdout, name)
    assert got["fsdp-offload"] <= 0.5 and got["fsdp-offload"] == pytest.approx(got["l2l-cmp"], rel=0.05), got


@pytest.mark.slow  # make test-slow; the default run checks every peer once
def test_fsdp_in_fp16_scales_its_loss_and_stays_within_the_bound():
    proc = _one_rank("fsdp-offload", "precision=fp16")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _largest(proc.stdout, "fsdp-offload") <= 0.5


def _x(rows: list[str], cap: str | None = None, *sets: str) -> list:
    from suite.core.experiment import get_experiment

    over = [f"device_memory={cap}"] if cap else []
    return get_experiment("table5").cells("tiny", rows, [*over, *sets], None)


@pytest.mark.slow  # make test-slow (22 s: three counts); the default run checks the precount's verdict below
def test_fsdp_is_counted_against_its_cap_plus_what_its_offload_keeps_on_the_host():
    """A count on a CPU holds FSDP2's FP32 parameters, gradients and moments on the device; its GPU run offloads
    them. So the count is past its cap only past the cap plus those bytes (16 a parameter): a cap between the two
    passes with the offload and fails without it."""
    from suite.core.launcher import run_cell

    def count(cap, *sets):
        (cell,) = _x(["peer-fsdp-x1"], cap, *sets)
        return run_cell(dataclasses.replace(cell, kind="count"))

    free = count("1TiB")
    peak, allowance = free["metrics"]["device_peak_allocated"], free["metrics"]["count_allowance_gb"] * 1e9
    assert free["status"] == "ok" and 0 < allowance < peak
    cap = f"{int(peak - allowance / 2)}B"
    offloaded = count(cap)
    assert offloaded["status"] == "ok" and offloaded["metrics"]["device_peak_allocated"] == peak
    kept = count(cap, "offload=off")  # the count is then the device's own: past the cap
    assert kept["status"] == "oom" and "count_allowance_gb" not in kept["metrics"]


def test_a_peer_past_its_cap_even_offloaded_is_found_before_it_runs():
    """The campaign's precount takes the offloading peer too: at 64 samples its count passes the 10 MiB cap plus
    its offload's bytes, so the cell is recorded oom without running."""
    from suite.core.runner import counted_past_cap

    (cell,) = _x(["peer-fsdp-x1"])
    (outcome,) = counted_past_cap([cell], None, lambda m: None).values()
    assert outcome["status"] == "oom" and outcome["error"].startswith("not run: its count passed")
    assert outcome["metrics"]["count_allowance_gb"] > 0
