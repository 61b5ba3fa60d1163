"""The campaign's estimate: each cell's device seconds from the target machine's records, FLOPs where it has none."""

import dataclasses
import json

import pytest

from suite.commands import cli
from suite.commands.campaign.estimate import COUNTS_S, DEFAULT_OVERHEAD_S, TESTS_S, WORKER_CELL_S, estimate, report
from suite.commands.campaign.stages import STAGES, Stage, Sweep
from suite.core.experiment import get_experiment
from suite.harness.model import param_count


def _record(
    tmp_path, cell, step_time, rounds, duration, status="partial: 1/3 rounds", throughput=20.0, machine="h100-test"
):
    folder = tmp_path / "runs" / machine
    folder.mkdir(parents=True, exist_ok=True)
    rec = {
        "key": cell.key, "experiment": cell.experiment, "row": cell.row.name, "method": cell.run.method,
        "profile": "paper", "device_type": "cuda", "variant": "", "config": cell.resolved(), "finished": "now",
        "status": status, "rounds": rounds, "duration_s": duration, "provenance": {"methodology": "1"},
        "metrics": {"step_time_median": step_time, "throughput": throughput} if step_time else {},
        "machine": {"slug": machine},
    }  # fmt: skip
    (folder / f"{cell.key}.json").write_text(json.dumps(rec))


def test_a_measured_cell_costs_its_steps_and_one_build_in_the_worker(tmp_path):
    table2 = get_experiment("table2")
    base, amp = table2.cells("paper", ["baseline-fp32", "baseline-amp"], None, None)
    steps = base.run.warmup + base.run.steps
    _record(tmp_path, base, step_time=2.0, rounds=1, duration=16.0 + steps * 2.0)  # 16 s to start a process
    stages = {2: Stage("t", sweeps=(Sweep("table2", only=("baseline-fp32", "baseline-amp")),))}
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    first = lines["table2/baseline-fp32"]
    assert first.rounds == 3 and first.source == "worker; steps measured"
    assert first.seconds == pytest.approx(16.0 + 3 * (steps * 2.0 + WORKER_CELL_S))  # the shape is built once
    second = lines["table2/baseline-amp"]  # no record: FLOPs at the MFU of the machine's records; no second build
    assert second.source.startswith("worker; steps flops at") and "(all methods)" in second.source
    fresh = {ln.what: ln for ln in estimate(stages, "h100", worker=False, results_dir=tmp_path)}
    assert fresh["table2/baseline-fp32"].seconds == pytest.approx(3 * (steps * 2.0 + 16.0))  # a process per round


def test_a_process_start_is_fitted_over_model_sizes_and_the_worker_starts_once(tmp_path):
    """Records at 24 and 48 layers whose starts took 10 s plus 20 s a billion parameters: a fresh process at 96
    layers costs 10 s plus its parameters' share; the worker pays the 10 s once and only the build of each new
    shape."""
    table5 = get_experiment("table5")
    x1, x2, x4 = table5.cells("paper", ["stash-cpu-x1", "stash-cpu-x2", "stash-cpu-x4"], None, None)
    n = {c.row.name: param_count(c.run.model) / 1e9 for c in (x1, x2, x4)}
    assert 0.3 < n["stash-cpu-x1"] < n["stash-cpu-x2"] < n["stash-cpu-x4"] < 1.3
    for cell in (x1, x2):
        _record(tmp_path, cell, step_time=1.0, rounds=1, duration=10.0 + 20.0 * n[cell.row.name] + 3 * 1.0)
    stages = {3: Stage("t", sweeps=(Sweep("table5", only=("stash-cpu-x1", "stash-cpu-x4")),))}
    fresh = {ln.what: ln for ln in estimate(stages, "h100", worker=False, results_dir=tmp_path)}
    x4_steps = fresh["table5/stash-cpu-x4"].seconds - (10.0 + 20.0 * n["stash-cpu-x4"])
    assert x4_steps > 0 and fresh["table5/stash-cpu-x1"].seconds == pytest.approx(10.0 + 20.0 * n["stash-cpu-x1"] + 3)
    pooled = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    start = 10.0 + 20.0 * n["stash-cpu-x1"]
    assert pooled["table5/stash-cpu-x1"].seconds == pytest.approx(start + 3.0 + WORKER_CELL_S)
    assert pooled["table5/stash-cpu-x4"].seconds == pytest.approx(20.0 * n["stash-cpu-x4"] + x4_steps + WORKER_CELL_S)


def test_the_worker_builds_each_shape_once_a_round_and_l2l_takes_its_copy_from_the_pool(tmp_path):
    """Table 3 (one shape): one build for the whole sweep, L2L's cells included; a model past the pool's limit
    (an eighth of the target's host memory) is built for every cell."""
    table3 = get_experiment("table3")
    l2l, amp = table3.cells("paper", ["l2l-cmp-u1", "amp-rc-u1"], None, None)
    steps = l2l.run.warmup + l2l.run.steps
    _record(tmp_path, l2l, step_time=1.0, rounds=1, duration=16.0 + steps * 1.0)
    _record(tmp_path, amp, step_time=1.0, rounds=1, duration=16.0 + steps * 1.0)
    stages = {2: Stage("t", sweeps=(Sweep("table3", only=("l2l-cmp-u1", "amp-rc-u1")),))}
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    assert lines["table3/l2l-cmp-u1"].seconds == pytest.approx(16.0 + 3 * (steps + WORKER_CELL_S))
    assert lines["table3/amp-rc-u1"].seconds == pytest.approx(3 * (steps + WORKER_CELL_S))
    env = tmp_path / "campaign" / "h100-test"
    env.mkdir(parents=True)
    (env / "environment.json").write_text(json.dumps({"machine": {"cpu": {"ram_bytes": 2**30}}}))  # 128 MiB pool
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    assert lines["table3/amp-rc-u1"].seconds == pytest.approx(3 * (steps + WORKER_CELL_S + 16.0))


def test_a_method_without_records_is_costed_at_its_table_then_its_precision(tmp_path):
    """An FP32 peer with no record runs at the utilisation of the same table's FP32 records (its shapes), else of
    the machine's FP32 records, not at the median of all records, most of them 16-bit against a peak 15 times
    higher."""
    table2, table5 = get_experiment("table2"), get_experiment("table5")
    base, amp, peer = table2.cells("paper", ["baseline-fp32", "baseline-amp", "peer-fsdp-fp32"], None, None)
    (other,) = table5.cells("paper", ["fp32-baseline-x1"], None, None)
    _record(tmp_path, amp, step_time=2.0, rounds=1, duration=30.0, throughput=32.0)  # about 3% of 16-bit's peak
    _record(tmp_path, other, step_time=2.0, rounds=1, duration=30.0, throughput=32.0)  # table5's FP32, about 48%
    stages = {2: Stage("t", sweeps=(Sweep("table2", only=("peer-fsdp-fp32",)),))}

    def peer_line():
        return next(ln for ln in estimate(stages, "h100", results_dir=tmp_path) if ln.what == "table2/peer-fsdp-fp32")

    line = peer_line()
    assert line.source.endswith("MFU (fp32 methods)"), line.source
    mfu = float(line.source.split("flops at ")[1].split("%")[0])
    assert 40 < mfu < 60  # FP32's, not the median of the two (about 26%)
    _record(tmp_path, base, step_time=4.0, rounds=1, duration=30.0, throughput=16.0)  # table2's own FP32: half
    line = peer_line()
    assert line.source.endswith("MFU (table2's fp32)"), line.source
    assert 20 < float(line.source.split("flops at ")[1].split("%")[0]) < 30


def test_a_library_the_target_lacks_costs_its_cells_nothing(tmp_path):
    """The GPU image has no DeepSpeed: ZeRO's cells are recorded not_implemented there without starting. The
    target's environment report decides where it names the library."""
    (base,) = get_experiment("table2").cells("paper", ["baseline-fp32"], None, None)
    _record(tmp_path, base, step_time=2.0, rounds=1, duration=30.0, throughput=32.0)
    stages = {2: Stage("t", sweeps=(Sweep("table2", only=("peer-zero-offload-fp32",)),))}

    def zero():
        return next(ln for ln in estimate(stages, "h100", results_dir=tmp_path) if "zero" in ln.what)

    assert zero().seconds == 0.0 and "GPU_IMAGE_LACKS" in zero().source
    env = tmp_path / "campaign" / "h100-test" / "environment.json"
    env.parent.mkdir(parents=True)
    env.write_text(json.dumps({"versions": {"deepspeed": None}}))
    assert zero().seconds == 0.0 and "its environment report" in zero().source
    env.write_text(json.dumps({"versions": {"deepspeed": "0.19.8"}}))
    assert zero().seconds > 0.0 and zero().rounds == 3


def test_an_offloading_peer_is_skipped_only_by_a_count_that_allowed_for_its_offload(tmp_path):
    """A count of FSDP2 on a CPU keeps on the device what its GPU run offloads: only a count past the cap plus that
    allowance (`count_allowance_gb`) says the GPU run is past the cap too."""
    (cell,) = get_experiment("table5").cells("paper", ["peer-fsdp-x16"], None, None)
    count = dataclasses.replace(cell, kind="count")
    _record(tmp_path, count, step_time=None, rounds=0, duration=3.0, status="oom")
    stages = {3: Stage("t", sweeps=(Sweep("table5", only=("peer-fsdp-x16",)),))}

    def line():
        return next(ln for ln in estimate(stages, "h100", results_dir=tmp_path) if ln.what.endswith("x16"))

    assert line().seconds > 0.0  # a plain count's oom says nothing of the offloaded run
    path = next((tmp_path / "runs" / "h100-test").glob("*.json"))
    rec = json.loads(path.read_text())
    rec["metrics"] = {"count_allowance_gb": 78.0}
    path.write_text(json.dumps(rec))
    assert line().seconds == 0.0 and "not run" in line().source


def test_an_oom_record_costs_what_it_took_and_tests_are_assumed_without_a_report(tmp_path):
    (cell,) = get_experiment("table3").cells("paper", ["amp-u1"], None, None)
    _record(tmp_path, cell, step_time=None, rounds=0, duration=14.6, status="oom")
    stages = {1: Stage("tests", cuda_tests=True), 2: Stage("t", sweeps=(Sweep("table3", only=("amp-u1",)),))}
    lines = estimate(stages, "h100", results_dir=tmp_path)
    counts = ("table3: counts of its capped cells", COUNTS_S)  # the campaign counts capped cells first
    ref = lines[2]  # the reference row, which the sweep measures beside the rows that take ratios to it
    assert ref.what == "table3/l2l-cmp-u1" and ref.seconds > 0
    assert [(ln.what, ln.seconds) for ln in lines] == [
        ("cuda tests", TESTS_S),
        counts,
        (ref.what, ref.seconds),
        ("table3/amp-u1", 14.6),
    ]
    total = TESTS_S + COUNTS_S + ref.seconds + 14.6
    assert report(lines, "h100").splitlines()[-1] == f"estimated device time: {total:.0f} s"


def test_a_cell_counted_past_its_cap_costs_nothing_but_its_count(tmp_path):
    (cell,) = get_experiment("table5").cells("paper", ["baseline-x16"], None, None)
    count = dataclasses.replace(cell, kind="count")
    _record(tmp_path, count, step_time=None, rounds=0, duration=3.0, status="oom")
    stages = {3: Stage("t", sweeps=(Sweep("table5", only=("baseline-x16",)),))}
    counts, line, ref = estimate(stages, "h100", results_dir=tmp_path)  # the reference row measured beside it
    assert (counts.seconds, line.seconds, line.rounds) == (COUNTS_S, 0.0, 0) and "not run" in line.source
    assert line.decision == "past its cap" and (ref.what, ref.decision) == ("table5/stash-cpu-x1", "run")


def test_without_records_the_defaults_are_named(tmp_path):
    stages = {2: Stage("t", sweeps=(Sweep("table2", only=("l2l-fp32",)),))}
    *_, line = estimate(stages, "h100", results_dir=tmp_path)
    assert line.what == "table2/l2l-fp32" and "assumed" in line.source and line.seconds > DEFAULT_OVERHEAD_S


def test_the_command_prints_every_stage_and_the_total(capsys):
    assert cli.main(["campaign", "--estimate", "--device", "h100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("estimated device time: ") and out[-1].endswith(" s")
    assert out[-2].startswith("of which the peers' rows: ")  # their own line: no GPU has measured them yet
    assert [ln.split(":")[0] for ln in out if ln.startswith("stage ")] == [f"stage {n}" for n in sorted(STAGES)]
    assert any("table5/stash-cpu-x16" in ln for ln in out)


def test_counts_stored_for_the_target_cost_nothing_and_say_which_cells_pass_their_caps(tmp_path):
    """Counts made before for the target's versions (suite.core.precount) replace the sweep's counts on the GPU:
    the estimate costs them nothing and takes their verdicts; under other versions they count for nothing."""
    from suite.core import precount
    from suite.measure.provenance import versions

    stages = {2: Stage("t", sweeps=(Sweep("table3", only=("amp-rc-u1", "l2l-cmp-u1")),))}
    got = get_experiment("table3").cells("paper", ["amp-rc-u1", "l2l-cmp-u1"], ["device=cuda"], None)
    amp, l2l = sorted(got, key=lambda c: c.row.name)
    env = tmp_path / "campaign" / "h100-test"
    env.mkdir(parents=True)
    torch_v, transformers_v = versions()
    (env / "environment.json").write_text(json.dumps({"machine": {"torch": torch_v, "transformers": transformers_v}}))
    _record(tmp_path, l2l, step_time=1.0, rounds=1, duration=20.0)
    prov = {"torch": torch_v, "transformers": transformers_v}
    prov_of = lambda cell: {**prov, "code": precount.count_of(cell).code["code"]}  # noqa: E731
    precount.save(tmp_path, amp, {"status": "oom", "metrics": {}, "provenance": prov_of(amp)})
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    assert lines["table3: counts of its capped cells"].seconds == pytest.approx(COUNTS_S / 2)
    assert "1 of 2 counted before" in lines["table3: counts of its capped cells"].source
    assert lines["table3/amp-rc-u1"].rounds == 0 and "counted past its cap" in lines["table3/amp-rc-u1"].source
    precount.save(tmp_path, l2l, {"status": "ok", "metrics": {}, "provenance": prov_of(l2l)})
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    assert lines["table3: counts of its capped cells"].seconds == 0.0
    (env / "environment.json").write_text(json.dumps({"machine": {"torch": "2.0.0", "transformers": transformers_v}}))
    lines = {ln.what: ln for ln in estimate(stages, "h100", results_dir=tmp_path)}
    assert lines["table3: counts of its capped cells"].seconds == COUNTS_S and lines["table3/amp-rc-u1"].rounds == 3


def test_the_counted_test_is_costed_by_its_cells_until_a_report_says_what_it_took(tmp_path):
    """Without a stage report, the counted-against-measured test costs a session's start and each of its cells in a
    fresh process (the count runs beside it, on the host); with one, what the report says."""
    from suite.commands.campaign.estimate import CostTable, _params
    from suite.commands.campaign.stages import counted_cells

    (base,) = get_experiment("table2").cells("paper", ["baseline-fp32"], None, None)
    _record(tmp_path, base, step_time=2.0, rounds=1, duration=16.0 + 4 * 2.0)
    stages = {3: Stage("t", counted=True, counted_cells=counted_cells)}
    (line,) = estimate(stages, "h100", results_dir=tmp_path)
    table = CostTable("h100", tmp_path)
    cells = counted_cells()
    want = table.start() + sum(table.fresh_overhead(_params(c.run)) + 2 * table.step(c)[0] for c in cells)
    assert line.what == "counted vs measured" and line.seconds == pytest.approx(want)
    assert len(cells) == 4 and line.seconds > sum(table.build(_params(c.run)) for c in cells) > 0
    (tmp_path / "campaign" / "h100-test").mkdir(parents=True)
    (tmp_path / "campaign" / "h100-test" / "stage-3.json").write_text(
        json.dumps({"counted_vs_measured": {"seconds": 77}})
    )
    (line,) = estimate(stages, "h100", results_dir=tmp_path)
    assert line.seconds == 77 and line.source == "stage 3's report on h100-test"
    # a part cut at the deadline, or not started because its estimate did not fit: at least that long, never less
    for exit_, seconds in (("timeout", 9.0), ("not started", 9.0), ("timeout", 10 * want)):
        (tmp_path / "campaign" / "h100-test" / "stage-3.json").write_text(
            json.dumps({"counted_vs_measured": {"seconds": seconds, "exit": exit_}})
        )
        (line,) = estimate(stages, "h100", results_dir=tmp_path)
        assert line.seconds == pytest.approx(max(want, seconds)) and line.source.startswith(f"at least {seconds:.0f} s")


def test_a_host_benchmark_costs_what_another_machine_took_until_the_target_ran_it(tmp_path):
    (cell,) = get_experiment("bench-host-optim").cells("paper", ["layer-1-thread"], None, None)
    stages = {3: Stage("t", sweeps=(Sweep("bench-host-optim", only=("layer-1-thread",)),))}
    (line,) = estimate(stages, "h100", results_dir=tmp_path)
    assert line.seconds == TESTS_S / 2 and line.source == "assumed (a host benchmark)"
    folder = tmp_path / "runs" / "cpu-test"
    folder.mkdir(parents=True)
    rec = {
        "key": cell.key, "experiment": cell.experiment, "row": cell.row.name, "method": cell.run.method,
        "profile": "paper", "config": cell.resolved(), "finished": "now", "status": "ok", "rounds": 1,
        "duration_s": 23.5, "metrics": {}, "machine": {"slug": "cpu-test", "cpu": {"usable_cores": 2}},
        "device_type": "cpu", "variant": "", "provenance": {"methodology": "1"},
    }  # fmt: skip
    (folder / f"{cell.key}.json").write_text(json.dumps(rec))
    (line,) = estimate(stages, "h100", results_dir=tmp_path)
    assert line.seconds == 23.5 and line.source.startswith("its record on cpu-test (2 cores")


def test_an_8b_cell_costs_one_build_and_its_rounds_at_its_roofline_and_a_host_past_the_target_is_not_run(tmp_path):
    """decoder-8b on an H100 with no record of its own: each L2L-CMP cell costs a fresh start, the build of its
    model at half the draws (Hugging Face's init alone) and one warm-up with three rounds of steps, each at its
    roofline's step; FSDP2's offload, whose 16 bytes a parameter pass the target's host less its reserve, is
    recorded past its cap without running."""
    from methods import roofline
    from suite.commands.campaign.estimate import CostTable
    from suite.core.runner import HOST_RESERVE

    env = tmp_path / "campaign" / "h100-test" / "environment.json"
    env.parent.mkdir(parents=True)
    env.write_text(json.dumps({"machine": {"cpu": {"ram_bytes": 126 * 2**30}}, "versions": {}}))
    _record(tmp_path, get_experiment("table2").cells("paper", ["baseline-fp32"])[0], 2.0, 1, 16.0 + 6.0)
    rows = ("8b-l2l-cmp", "8b-fsdp")
    stages = {6: Stage("t", sweeps=(Sweep("decoder-8b", only=rows, fresh=True),))}
    lines = {ln.what: ln for ln in estimate(stages, "h100", worker=False, results_dir=tmp_path)}
    (cell, _) = get_experiment("decoder-8b").cells("paper", list(rows), ["device=cuda"], None)
    table = CostTable("h100", tmp_path)
    step = roofline.project(cell.run, roofline.MACHINES["h100"]).step_s
    l2l = lines["decoder-8b/8b-l2l-cmp"]
    assert l2l.source == "own process; steps its roofline on h100 (compute-bound)" and l2l.rounds == 1
    build = table.build(param_count(cell.run.model), "hf")
    assert build == pytest.approx(table.build(param_count(cell.run.model)) / 2)
    assert l2l.seconds == pytest.approx(table.start() + build + (1 + 3 * 2) * step)
    fsdp = lines["decoder-8b/8b-fsdp"]
    assert fsdp.decision == "past its cap" and fsdp.seconds == 0 and HOST_RESERVE == 8 * 2**30


def test_a_target_with_one_model_size_takes_the_other_kinds_growth_and_their_measured_steps(tmp_path):
    """An H200 whose only records are at BERT-Large's size cannot tell its fixed start from its growth with the
    model: it takes the H100's growth a draw (fitted there over two sizes) and keeps its own records' rest as its
    fixed part, instead of putting all of its start on the parameters. A cell the H100 measured, which the H200
    did not, costs the H100's step (the same peak); one neither measured takes the H100's utilisation of its table
    before the H200's of other tables."""
    from suite.commands.campaign.estimate import DRAWS, CostTable

    table5, table2 = get_experiment("table5"), get_experiment("table2")
    x1, x2, x4 = table5.cells("paper", ["stash-cpu-x1", "stash-cpu-x2", "stash-cpu-x4"], None, None)
    draws = {c.row.name: param_count(c.run.model) * DRAWS["full"] for c in (x1, x2, x4)}
    for cell in (x1, x2):  # on the H100: 10 s and 5 ns a draw
        _record(tmp_path, cell, 1.0, 1, 10.0 + 5e-9 * draws[cell.row.name] + 3 * 1.0, throughput=40.0)
    (amp,) = table2.cells("paper", ["baseline-amp"], None, None)
    amp_draws = param_count(amp.run.model) * DRAWS["full"]
    amp_steps = amp.run.warmup + amp.run.steps
    _record(tmp_path, amp, 2.0, 1, 30.0 + 5e-9 * amp_draws + amp_steps * 2.0, throughput=1.0, machine="h200-test")
    lone = CostTable("h200", tmp_path)
    assert lone.overhead == pytest.approx((30.0, 5e-9)) and "h100-test" in lone.assumptions()[0]
    assert CostTable("h100", tmp_path).overhead == pytest.approx((10.0, 5e-9))
    stages = {4: Stage("t", sweeps=(Sweep("table5", only=("stash-cpu-x1", "stash-cpu-x4")),))}
    lines = {ln.what: ln for ln in estimate(stages, "h200", worker=False, results_dir=tmp_path)}
    measured = "own process; steps h100-test's measured step x 1.00 (its peak / the target's)"
    assert lines["table5/stash-cpu-x1"].source == measured
    assert lines["table5/stash-cpu-x1"].seconds == pytest.approx(30.0 + 5e-9 * draws["stash-cpu-x1"] + 3 * 1.0)
    x4_source = lines["table5/stash-cpu-x4"].source  # l2l at table5's shapes: the H100's, not the H200's table2 AMP
    assert x4_source.endswith("MFU (l2l-cmp on the other lent kinds)"), x4_source
