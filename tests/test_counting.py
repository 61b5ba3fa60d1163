"""Counting (#12): a method's own step on fake tensors, its memory by place and role; checked against real tensors.

Every count runs in a probe process of its own (tests/probes/count_vs_real.py): fake storages and their
finalizers stay out of the test process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(micro_batch_size=4, num_micro_batches=2, seq_len=32)


def probe(cases: list[dict]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/probes/count_vs_real.py"), json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def case(method, precision, options=None, layers=None, **kw) -> dict:
    run = dict(method=method, precision=precision, options=options or {}, **SHAPE)
    if layers:
        run["model"] = {"layers": layers}
    return {"run": run, **kw}


# On the CPU device: the same tracker on real tensors must see exactly what the count sees.
SAME_DEVICE = [
    case("grad_accum", "fp32", real=True),
    case("amp", "bf16", real=True),
    case("grad_accum", "fp32", {"recompute": "on"}, real=True),
    case("2bw-reference", "fp32", real=True),
    case("pipedream-flush", "fp32", {"stages": 2}, real=True),  # both stages in one process (reference executor)
]
# L2L on `meta`: its device counted apart from the host. Its device peak is what the CPU run's tracker sees
# (the host work runs on a worker thread there, out of the tracker's sight; the stash's host buffers persist).
L2L = [
    case("l2l", "fp32", {"stash": "cpu"}, device="meta", real=True),
    case("l2l-cmp", "bf16", {"stash": "gpu", "overlap": "on"}, device="meta", real=True),
    case("l2l-cmp", "bf16", {"stash": "cpu"}, layers=8, device="meta"),
    case("l2l-cmp", "bf16", {"stash": "cpu"}, layers=16, device="meta"),
]


@pytest.fixture(scope="module")
def probed():
    return probe(SAME_DEVICE + L2L)


def test_counted_peak_is_the_real_tensors_peak_on_one_device(probed):
    for c, got in zip(SAME_DEVICE, probed):
        counted, real = got["counted"], got["real"]
        assert counted["device_peak_allocated"] == pytest.approx(real["resident"] + real["step_peak"], rel=0.01), (
            c["run"]["method"],
            counted,
            real,
        )
        assert "host_peak_bytes" not in counted  # the device is the host: nothing counted apart


def test_l2l_device_is_counted_apart_from_its_host(probed):
    for got, wire in zip(probed[len(SAME_DEVICE) : len(SAME_DEVICE) + 2], (0, 2)):
        counted, real = got["counted"], got["real"]
        assert counted["device_peak_allocated"] == pytest.approx(real["resident"] + real["step_peak"], rel=0.01)
        # the four slots' weights and gradients, and (which resident_device_bytes leaves out) their position ids
        assert real["resident"] < counted["device_resident_bytes"] < real["resident"] * 1.01
        host = counted["host_breakdown"]
        # FP32 masters (plus CMP's 16-bit wire copies) and two FP32 moments: the optimizer is on the host alone
        assert host["parameters"] == host["optimizer"] // 2 * (4 + wire) // 4 > 0
        # and the gradients' landings (one a layer, or a ring applied as it lands) with CMP's FP32 scratch
        assert host["gradients"] == real["host_gradient_bytes"] > 0
        assert counted["device_breakdown"]["optimizer"] == 0
        assert counted["host_peak_bytes"] > counted["host_resident_bytes"] > 3 * counted["device_resident_bytes"]


def test_breakdown_adds_up_to_each_peak(probed):
    for got in probed:
        c = got["counted"]
        assert sum(c["device_breakdown"].values()) == c["device_peak_allocated"]
        if "host_breakdown" in c:
            assert sum(c["host_breakdown"].values()) == c["host_peak_bytes"]


def test_grad_accum_roles(probed):
    plain, _, recompute, *_ = (g["counted"]["device_breakdown"] for g in probed[: len(SAME_DEVICE)])
    assert plain["gradients"] == plain["parameters"]  # FP32 gradient per FP32 weight, at the peak
    assert plain["optimizer"] == 2 * plain["parameters"]  # LAMB's two moments
    assert 0 < recompute["stash"] < plain["stash"]  # recompute keeps block inputs only


def test_l2l_device_memory_is_flat_in_depth_with_the_stash_on_the_host(probed):
    at8, at16 = (g["counted"] for g in probed[-2:])
    assert at16["device_peak_allocated"] == at8["device_peak_allocated"]
    assert at16["host_peak_bytes"] > 1.5 * at8["host_peak_bytes"]  # the depth is on the host


STEADY = [  # methods that claim steady_after = 0, on the device their counts use
    ("grad_accum", "fp32", {}, "cpu"),
    ("amp", "bf16", {}, "cpu"),
    ("gpipe", "fp32", {"stages": 2}, "cpu"),
    ("pipedream-flush", "fp32", {"stages": 2}, "cpu"),
    ("l2l", "fp32", {"stash": "gpu"}, "meta"),
    ("l2l", "fp32", {"stash": "cpu"}, "meta"),
    ("l2l-cmp", "bf16", {"stash": "cpu", "overlap": "on"}, "meta"),
]


@pytest.mark.slow  # make test-slow: make test stays inside its 15 minutes on a 2-core machine
def test_methods_steady_from_their_first_step_count_without_a_warm_up():
    """Weights and optimizer state are made when a method is built (LayerwiseOptimizer preallocates its state; L2L's
    slots, param server and stash buffers are all alive at the first step's peak), so a count needs no warm-up
    step (Method.steady_after = 0): the first step's peaks, device and host, are those after one."""
    from suite.core import registry

    assert all(registry.get(m).steady_after == 0 for m, *_ in STEADY)
    cases = [case(m, p, o, device=d, warmup=w) for m, p, o, d in STEADY for w in (0, 1)]
    got = [g["counted"] for g in probe(cases)]
    for (method, *_), first, steady in zip(STEADY, got[::2], got[1::2]):
        assert first["device_peak_allocated"] == steady["device_peak_allocated"], method
        assert first.get("host_peak_bytes") == steady.get("host_peak_bytes"), method


def test_a_count_past_the_cap_is_out_of_memory_and_rounding_only_adds():
    small, rounded, capped = probe(
        [
            case("grad_accum", "fp32"),
            case("grad_accum", "fp32", round_to=512),
            case("grad_accum", "fp32", limit=1_000_000),
        ]
    )
    assert small["counted"]["device_peak_allocated"] < rounded["counted"]["device_peak_allocated"]
    assert rounded["counted"]["device_peak_allocated"] < 1.5 * small["counted"]["device_peak_allocated"]
    assert "exceed the cap of 1000000 bytes" in capped["counted"]["oom"]
    assert capped["counted"]["oom_device_bytes"] > 1_000_000


@pytest.mark.parametrize(
    "method",
    # make test-slow (about 20 s each): the measured torchrun ranks; the default run still counts every stage
    # (test_the_counted_stages_hold_the_worst_one)
    [pytest.param("pipedream-flush", marks=pytest.mark.slow), pytest.param("pipedream-2bw", marks=pytest.mark.slow)],
)
def test_each_pipeline_stage_counted_as_its_torchrun_rank_measures_it(method):
    """The real run: 2 gloo ranks under torchrun, each rank's resident bytes plus its tracked step peak.

    A fake group completes every transfer at once, as the NCCL path waits for its batch at once; on gloo a send
    stays pending (its tensor alive) until the peer posts the receive. So the real gloo rank holds up to the
    step's boundary tensors more than the count, never less: at most one activation and one gradient per
    micro-batch (here 2 x 16 x 4 x 32 x 64 FP32 = 1 MiB)."""
    from suite.core.experiment import get_experiment
    from suite.core.launcher import run_cell

    (cell,) = get_experiment("2bw-fig7").cells("tiny", [f"measured-{method}-rc0"], ["steps=1", "warmup=2"])
    record = run_cell(cell, timeout=300)
    assert record["status"] == "ok", record.get("error", "")[-2000:]
    (got,) = probe([{"run": cell.run.to_dict(), "world": 2}])
    counted = [r["device_peak_allocated"] for r in got["ranks"]]
    run = cell.run
    in_flight = 2 * run.num_micro_batches * run.micro_batch_size * run.seq_len * run.model.resolved().hidden * 4
    for mine, real in zip(counted, record["metrics"]["rank_memory"]):
        assert mine <= real <= mine + in_flight, (counted, record["metrics"]["rank_memory"], in_flight)


@pytest.mark.slow  # a table end to end as counts (the runner's and the precount's counts run in the default tests)
def test_measure_count_runs_a_table_as_counted_cells(tmp_path, monkeypatch):
    from suite.commands.sweep import sweep
    from suite.core.experiment import get_experiment
    from suite.core.request import SweepRequest

    monkeypatch.setenv("SUITE_MACHINE", "counter")
    exp = get_experiment("table5")
    rows = ["baseline-x1", "baseline-x2", "stash-cpu-x1", "stash-cpu-x4"]
    records = sweep(
        SweepRequest(exp, "tiny", rows, results_dir=tmp_path, wandb_mode="off", measure="count"),
        progress=lambda m: None,
    )
    by_row = {r["row"]: r for r in records}
    # the paper's claim at tiny under its 10 MiB cap, as the measured tiny rows show it: the baseline fits at
    # 4 layers and not at 8; L2L with the stash on the host fits, as flat at 16 layers as at 4
    assert {k: r["status"] for k, r in by_row.items()} == {
        "baseline-x1": "ok",
        "baseline-x2": "oom",
        "stash-cpu-x1": "ok",
        "stash-cpu-x4": "ok",
    }
    m1, m4 = by_row["stash-cpu-x1"]["metrics"], by_row["stash-cpu-x4"]["metrics"]
    assert m1["memory_kind"].startswith("counted") and m1["device_peak_allocated"] == m4["device_peak_allocated"]
    assert m4["host_peak_bytes"] > m1["host_peak_bytes"]
    text = (tmp_path / "table5.md").read_text()
    assert "counted (fake tensors), not measured" in text and "Counted memory by role" in text


def test_measure_count_refuses_cells_that_build_no_method():
    from suite.config.errors import ConfigError
    from suite.core.experiment import get_experiment
    from suite.core.plan import counted

    with pytest.raises(ConfigError, match="--measure count"):
        counted(get_experiment("table7").cells("tiny"))


@pytest.mark.parametrize(  # 2BW (two weight versions) in the default run; the other schedules in make test-slow
    "method",
    [
        pytest.param("gpipe", marks=pytest.mark.slow),
        pytest.param("pipedream-flush", marks=pytest.mark.slow),
        "pipedream-2bw",
    ],
)
def test_the_counted_stages_hold_the_worst_one(method):
    """Method.counted_ranks of a pipeline names the first stage of each kind (first, last, each distinct set of
    middle layers); every stage counted, none of the others holds more than the counted one of its kind."""
    from suite.config.run import RunConfig
    from suite.core import registry

    c = case(method, "fp32", {"stages": 4, "executor": "dist", "recompute": True}, layers=6)
    c["run"].update(num_micro_batches=8)
    run = RunConfig.from_dict(c["run"]).validate()
    picked = registry.get(method).counted_ranks(run)
    assert picked[0] == 0 and picked[-1] == 3 and len(picked) < 4  # 8 layers on 4 stages: two middles alike
    (got,) = probe([{**c, "world": 4}])
    every = [r["device_peak_allocated"] for r in got["ranks"]]
    assert max(every) == max(every[r] for r in picked), (picked, every)
    for s in set(range(4)) - set(picked):
        assert every[s] <= max(every[r] for r in picked if 0 < r < 3), (s, picked, every)


def test_a_one_f_one_b_last_stage_holds_no_more_for_more_micro_batches():
    """The head's logits (batch x seq x vocab) are kept in each micro-batch's context for evaluation; a pipeline
    keeps every context of a step, so its last stage drops them once the loss is taken. Without that the last
    stage grew by a micro-batch's logits per micro-batch (23.0 GB instead of 9.9 at Figure 9's d = 64)."""
    opts = {"stages": 2, "executor": "dist", "recompute": True}
    cases = []
    for m in (2, 8):
        c = case("pipedream-flush", "fp32", opts, world=2)
        c["run"].update(num_micro_batches=m, model={"family": "gpt2"})  # a language model: logits over the vocab
        cases.append(c)
    few, many = (g["ranks"][1]["device_peak_allocated"] for g in probe(cases))
    # What does grow: each micro-batch's int64 inputs and labels of 4 x 32 and their copies (8 KiB a micro-batch
    # here); the logits would add 4 x 32 x 1024 FP32 = 512 KiB a micro-batch.
    assert 0 <= many - few <= 6 * 16 * 1024


def test_the_largest_count_search_finds_the_edge_from_any_guess():
    from methods.pipeline.planner.largest import search

    calls = []

    def fits(n):
        calls.append(n)
        return n <= 37

    assert search(fits, 37, 1) == 37 and calls == [37, 38]  # a right guess: two counts
    for guess in (1, 5, 36, 38, 60, 500):
        assert search(lambda n: n <= 37, guess, 1) == 37, guess
    assert search(lambda n: n <= 3, 10, 3) == 3
    assert search(lambda n: False, 10, 3) == 0  # not even the least fits
    assert search(lambda n: True, 10, 3, most=40) == 40


@pytest.mark.slow  # make test-slow (27 s of counts); the search itself is tested above, the counts below
def test_figure9_counted_searches_the_largest_model_over_counts(tmp_path, monkeypatch):
    """2bw-fig9's projected rows under --measure count: the most blocks whose counted worst stage fits, the
    planner's guess beside it and every count the search made; one block more is out of memory."""
    from suite.commands.sweep import sweep
    from suite.core.experiment import get_experiment
    from suite.core.request import SweepRequest

    monkeypatch.setenv("SUITE_MACHINE", "counter")
    exp = get_experiment("2bw-fig9")
    over = ["model.hidden=64", "model.heads=2", "model.intermediate=256", "model.vocab_size=512", "seq_len=32"]
    (rec,) = sweep(
        SweepRequest(
            exp,
            "tiny",
            ["projected-d2"],
            device_memory="4MB",
            overrides=over,
            results_dir=tmp_path,
            wandb_mode="off",
            measure="count",
        ),
        progress=lambda m: None,
    )
    assert rec["status"] == "ok", rec.get("error")
    m = rec["metrics"]
    n = m["max_layers"]
    assert m["searched"][str(n + 1)] == "oom" and m["searched"][str(n)] == m["memory_worst_rank_gb"] <= 0.004
    assert n >= 2 and m["counted_ranks"] == [0, 32] and "planner_guess" in m


def test_a_count_on_meta_runs_sdpa_as_a_gpu_does_without_the_scores():
    """On `meta` (a hosted method's device in a count) SDPA would fall back to the math path and hold the S x S
    scores for its backward; under the count it takes the fused flash kernel, which holds only what CUDA's does.
    Queries with twice the key-value heads (Llama's grouped-query attention) are served too."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from suite.measure.counting import fused_attention

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with FakeTensorMode():
        q = torch.randn(2, 4, 64, 8, device="meta", requires_grad=True)
        kv = [torch.randn(2, 2, 64, 8, device="meta", requires_grad=True) for _ in range(2)]
        with fused_attention(), Ops() as ops:
            out = torch.nn.functional.scaled_dot_product_attention(q, *kv, is_causal=True, enable_gqa=True)
        assert out.shape == q.shape and any("flash_attention_for_cpu" in op for op in ops.seen)
        assert not any("bmm" in op or "softmax" in op for op in ops.seen)
        out.sum().backward()
        assert q.grad.shape == q.shape and kv[0].grad.shape == kv[0].shape
        with Ops() as plain:  # outside the count: torch's own choice (the math path on meta)
            torch.nn.functional.scaled_dot_product_attention(q, *kv, is_causal=True, enable_gqa=True)
        assert any("bmm" in op for op in plain.seen)


def test_l2l_cmp_with_adamw_counts_its_commit_as_it_lands_and_its_clipping_on_the_device():
    """L2L-CMP with AdamW applies each gradient as it lands (a ring on the host), clipped or not: clipped, every
    layer's 16-bit gradient waits on the device until the norm is known (2 bytes a parameter there, none more on the
    host). The counts agree with the real tensors' tracker."""
    cases = [case("l2l-cmp", "bf16", {"stash": "gpu", "overlap": "on"}, device="meta", real=True) for _ in range(2)]
    for c, clip in zip(cases, (0.0, 0.05)):
        c["run"].update(optimizer="adamw", clip_grad_norm=clip)
    plain, clipped = probe(cases)
    for got in (plain, clipped):
        counted, real = got["counted"], got["real"]
        assert counted["device_peak_allocated"] == pytest.approx(real["resident"] + real["step_peak"], rel=0.01)
        assert counted["host_breakdown"]["gradients"] == real["host_gradient_bytes"] > 0
    p, c = plain["counted"], clipped["counted"]
    # the same host, but for the clipping coefficient's 4 bytes among its transients
    assert {**c["host_breakdown"], "transient": 0} == {**p["host_breakdown"], "transient": 0}
    assert 0 <= c["host_breakdown"]["transient"] - p["host_breakdown"]["transient"] <= 16
    params = p["host_breakdown"]["parameters"] // 6  # the FP32 master and its 16-bit copy a parameter
    held = c["device_breakdown"]["gradients"] - p["device_breakdown"]["gradients"]
    assert 2 * params <= held < 2 * params * 1.001  # each layer's buffer rounded up to the device's 512 B
