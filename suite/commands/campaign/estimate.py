"""What a GPU campaign will cost before a GPU is lent: each stage's cells with their estimated device seconds.

Which cells run, and how many rounds, is not decided here: each stage's sweep is planned by the runner's own plan
(suite.core.plan) from the target's records, with what the target lacks and its stored counts; a cell the plan
settles without running (reused, a twin's, not run, past its cap, complete) costs nothing, and this module prices
the rest. A cell-round's cost is its timed part, (warm-up + timed steps) x step time, plus what starting it costs:
- the step time is the target machine's own record of the cell where one was measured (`measured`), else the
  cell's step measured on another lent GPU kind (the catalogue's: the same image and architecture), times its peak
  over the target's, else, where the target has no record of the cell's table in its precision, a decoder's
  (Llama's) step by its method's roofline on the target's kind where it has one (methods/roofline.py: L2L, FSDP2's
  offload, AMP, AG), else the training FLOPs (suite.measure.flops) at the median MFU that machine's records of the
  same method achieved (`flops`), else at the median of its records of the same table in the same precision (its
  shapes: sequence and micro-batch), else the other lent kinds' MFU of the method, then of the table, else of all
  the target's records in that precision (an FP32 peer is costed like the FP32 methods, not at the
  mixed-precision methods' utilisation of a 15x higher peak), else at the median of all its records;
- a cell whose method needs a library the target lacks (its environment report, else GPU_IMAGE_LACKS) costs
  nothing: it is recorded not_implemented there without starting; nor does a capped cell a count record puts past
  its cap (for an offloading peer, a count made against the cap plus what its offload keeps on the host);
- a cell in the campaign's worker pays WORKER_CELL_S (copy of the pooled model, upload, first steps' kernels) and
  the build of its model where the pool does not hold that shape: the worker runs each round's cells grouped by
  shape (suite.core.schedule.by_shape), and its pool keeps a model up to an eighth of the target's host memory
  (suite.harness.model.pool_limit); the worker's own start is paid once a stage (each stage is one command on a
  lent GPU, and so one worker). Both come from the
  fresh-process overhead the target's records show (their duration per round less their timed part), fitted as a
  fixed part (imports, CUDA's context) plus a part per parameter (the build, the host generator's draws: half of it
  under Hugging Face's init alone, model.init=hf) by least squares over the model sizes they ran at (one size: the
  growth a draw of the other lent kinds' records where they span sizes, named in the report's head, else all of it
  per parameter); a cell measuring several rounds in the process that built its model pays its warm-up once
  and each round's timed steps; a cell in its own process (several ranks, an expected
  OOM, a benchmark) pays that whole overhead every round;
- a cell the target machine recorded `oom` costs what that record took; a sweep's counts of its capped cells
  COUNTS_S, less the share stored before for the target (suite.core.precount), whose verdicts it then takes;
- the tests of stage 1 cost what that machine's stage reports say they took, else what they run
  (_tests_seconds); a host benchmark, its latest record's time on any machine (named).
Every assumption is named in the line it shapes. The last line is `estimated device time: N s`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from suite.config import paths
from suite.core import precount, runner
from suite.core.experiment import Cell
from suite.core.kinds import KINDS
from suite.core.plan import COMPLETE, PAST_CAP, REUSED, RUNS, TWIN, Decision, Plan, expand, plan
from suite.core.registry import get as get_method
from suite.core.schedule import pooled, shape_of
from suite.harness.model import param_count, pool_limit
from suite.measure import flops, machines
from suite.records.index import latest_of_rows, open_index, row_of
from suite.records.schema import Outcome, Record, failed, machine_of

WORKER_CELL_S = 2.0  # assumed: a pooled cell's copy, upload to the GPU and first-step kernels (not yet measured)
TESTS_S = 120.0  # assumed: a stage's tests where no report of the target machine says how long they took
DEFAULT_OVERHEAD_S = 15.0  # assumed where the target has no record: the H100 run's fresh processes took 14-18 s
DEFAULT_MFU = 0.1  # assumed where the target has no record at all
DEFAULT_RAM = 128 * 2**30  # assumed where the target's environment report does not say: the lent GPU machines' host
BENCHMARKS, BENCHMARK_S = 3, 2.0  # assumed: the host benchmarks of L2L's microbenchmarks (pytest-benchmark's 1 s
# max time each, with its calibration)
BENCH_STEPS = 7  # their CUDA step breakdown: two warm-up steps and five timed ones (tests/l2l/test_l2l_bench.py)
COUNTS_S = 30.0  # assumed: a sweep's counts of its capped cells, side by side on the host's cores, before it runs
# What the lent GPU's image lacks (docs/gpu-campaign.md; the mimic environment checks the same, Makefile MIMIC_ABSENT)
# where a target's environment report does not name the library (the first H100 report predates the question).
GPU_IMAGE_LACKS = ("datasets", "wandb", "deepspeed")


@dataclass
class Line:
    stage: int
    what: str
    rounds: int
    seconds: float
    source: str
    peer: bool = False  # a peer's row (the field's implementation), which no GPU record has costed yet
    decision: str = ""  # a cell's: what the runner's plan decides for it on the target (suite.core.plan)


def _timed(cell: Cell) -> int:
    """The steps a cell-round runs: its warm-up, then its timed steps (times the rounds it measures in the process
    that built its model, suite.core.cell.throughput_rounds_cell)."""
    return cell.run.warmup + cell.run.options.get("rounds_inside", 1) * cell.run.steps


def _step_time(rec: Record | None) -> float | None:
    m = (rec or {}).get("metrics") or {}
    return m.get("step_time_median") if isinstance(m.get("step_time_median"), (int, float)) else None


@dataclass
class Utilisation:
    """The MFU a set of records achieved: by method, by table in a precision, and by precision."""

    by_method: dict = field(default_factory=dict)
    by_table: dict = field(default_factory=dict)
    by_precision: dict = field(default_factory=dict)

    def add(self, r: Record, mfu: float | None) -> None:
        if mfu:
            run = r["config"]["run"]
            precision = run.get("precision", "fp32")
            self.by_method.setdefault(run["method"], []).append(mfu)
            self.by_table.setdefault((r["experiment"], precision), []).append(mfu)
            self.by_precision.setdefault(precision, []).append(mfu)

    def all(self) -> float | None:
        mfus = [m for ms in self.by_method.values() for m in ms]
        return statistics.median(mfus) if mfus else None


class CostTable:
    """The target machine's records, read for step times, achieved MFU and process overheads."""

    def __init__(self, device: str, results_dir: Path):
        self.device = device
        index = open_index(results_dir)
        every = index.records()
        recs = [r for r in every if machine_of(r).startswith(device)]
        # Counts hold no data, so any machine's says whether a cell passes its cap (the campaign counts it again).
        self.counted = index.latest_each(where=lambda r: r["config"].get("kind") == "count")
        self.by_cell = {row_of(r): r for r in recs}
        # Any machine's latest record of a cell that took a known time: a host benchmark's cost before the target
        # has run it (its host differs: said where it is used).
        self.elsewhere = index.latest_each(where=lambda r: bool(r.get("duration_s")))
        # the target: the machine of its records, else one whose environment report alone is here (stage 1 ran)
        reports = sorted(p.parent.name for p in (results_dir / "campaign").glob(f"{device}*/environment.json"))
        self.machine = machine_of(recs[0]) if recs else (reports[0] if reports else None)
        env = _environment(results_dir, self.machine)
        self.versions = env.get("versions") or {}
        # Counts stored before the campaign (suite.core.precount) speak for the target where made by this code under
        # the target's torch and transformers (its environment report; none without one).
        target = env.get("machine") or {}
        self.results_dir = results_dir
        self.precount_as = (target["torch"], target.get("transformers")) if target.get("torch") else None
        self.ram = (target.get("cpu") or {}).get("ram_bytes") or DEFAULT_RAM
        self.pool_limit = pool_limit(self.ram)
        self.peak_name = machines.kind(device).gpu if device in machines.LENT else device
        overheads, self.mfu = [], Utilisation()
        for r in recs:
            if (point := _overhead_point(r)) is None:
                continue
            overheads.append(point)
            self.mfu.add(r, self._mfu(r["config"]["run"], r["metrics"]["throughput"]))
        # The other lent GPU kinds' records (the same image, a like host): a cell's step measured there, their
        # utilisation where the target has none of the method or the table, and their process starts' growth with
        # the model where the target's records span one model size
        kin = [r for r in every if _kind(machine_of(r)) not in (None, device) and _step_time(r) is not None]
        self.kin = latest_of_rows(kin)
        self.kin_mfu, kin_points, kin_machines = Utilisation(), [], set()
        for r in kin:
            if (point := _overhead_point(r)) is not None:
                kin_points.append(point)
                kin_machines.add(machine_of(r))
                peak_name = machines.kind(_kind(machine_of(r))).gpu
                self.kin_mfu.add(r, self._mfu(r["config"]["run"], r["metrics"]["throughput"], peak_name))
        self.overhead, self.overhead_how = _fit(overheads), f"fitted over {self.machine}'s records"
        prior = _fit(kin_points)
        if self.overhead and len({x for x, _ in overheads}) < 2 and prior and len({x for x, _ in kin_points}) > 1:
            self.overhead = _fit(overheads, per_draw=prior[1])
            self.overhead_how = (
                f"{self.machine}'s records span one model size: the growth a draw of the other lent kinds' "
                f"({', '.join(sorted(kin_machines))})"
            )

    def mfu_of(self, method: str) -> float | None:
        """The median MFU the target's records of `method` reached, else of all its records."""
        mfus = self.mfu.by_method.get(method)
        return statistics.median(mfus) if mfus else self.mfu.all()

    def assumptions(self) -> list[str]:
        """What the estimate took from where, beyond each line's own source: a process's start."""
        if not self.overhead:
            return [f"a process's start: {DEFAULT_OVERHEAD_S:.0f} s at BERT-Large, assumed (no {self.device} record)"]
        fixed, per_draw = self.overhead
        return [f"a process's start: {fixed:.1f} s and {1e9 * per_draw:.1f} ns a draw ({self.overhead_how})"]

    def _mfu(self, run: dict, throughput: float, peak_name: str | None = None) -> float | None:
        from suite.config.run import RunConfig

        cfg = RunConfig.from_dict(run)
        peak = flops.peak_tflops(peak_name or self.peak_name, cfg.precision)
        return throughput * flops.per_sample(cfg)["flops_per_sample"] / 1e12 / peak if peak else None

    def step(self, cell: Cell) -> tuple[float, str]:
        """Seconds per step of `cell` on the target, and where the figure comes from."""
        rec = self.by_cell.get(cell_key := (cell.experiment, cell.row.name, cell.profile))
        if _step_time(rec) is not None:
            return _step_time(rec), "measured"
        # Measured on another lent kind: its step at the target's peak (an estimate only, named)
        if (kin := self.kin.get(cell_key)) is not None:
            theirs = flops.peak_tflops(machines.kind(_kind(machine_of(kin))).gpu, cell.run.precision)
            ours = flops.peak_tflops(self.peak_name, cell.run.precision)
            scale = theirs / ours if theirs and ours else 1.0
            return _step_time(kin) * scale, f"{machine_of(kin)}'s measured step x {scale:.2f} (its peak / the target's)"
        table = (cell.experiment, cell.run.precision)
        # No record of its own table's shapes: their roofline, before the utilisation of other tables' shapes
        if not self.mfu.by_table.get(table) and (projected := self.roofline(cell)):
            return projected
        mfu, whose = self.mfu.all(), "all methods"
        method, shapes, other = cell.run.method, f"{cell.experiment}'s {cell.run.precision}", " on the other lent kinds"
        for mfus, name in (
            (self.mfu.by_method.get(method), method),
            # the same table's shapes (sequence, micro-batch) in the same precision: what sets utilisation most
            (self.mfu.by_table.get(table), shapes),
            # the other kinds' (the same architecture's) before the target's records of other shapes
            (self.kin_mfu.by_method.get(method), method + other),
            (self.kin_mfu.by_table.get(table), shapes + other),
            (self.mfu.by_precision.get(cell.run.precision), f"{cell.run.precision} methods"),
        ):
            if mfus:
                mfu, whose = statistics.median(mfus), name
                break
        if mfu is None:
            mfu, whose = DEFAULT_MFU, "assumed"
        peak = flops.peak_tflops(self.peak_name, cell.run.precision) or flops.peak_tflops(self.peak_name, "fp32")
        per_step = flops.per_sample(cell.run)["hardware_flops_per_sample"] * cell.run.batch_size
        return per_step / (peak * 1e12 * mfu), f"flops at {100 * mfu:.1f}% MFU ({whose})"

    def roofline(self, cell: Cell) -> tuple[float, str] | None:
        """The step of `cell` projected by its method's roofline on the target's kind (methods/roofline.py: its rates a
        lent GPU's bench-link record where one was made, else stated assumptions); None where there is none."""
        if self.device not in machines.LENT or cell.run.model.resolved().family != "llama":
            return None  # its rates are a decoder block's at thousands of tokens
        # the `roofline` cell kind, found by name as a cell finds it: the cell's run projected on the target's kind
        run = dataclasses.replace(cell.run, options={**cell.run.options, "projection": {"machine": self.device}})
        try:
            out = KINDS.load("roofline")(run, None, None, index=open_index(self.results_dir))
        except ValueError:  # a method (or setting) the roofline does not model
            return None
        return out["step_time"], f"its roofline on {self.device} ({out['bound']}-bound)"

    def precounted(self, cell: Cell) -> dict | None:
        """The count stored for the target (suite.core.precount) that its sweep will take instead of counting."""
        return precount.load(self.results_dir, cell, *self.precount_as) if self.precount_as else None

    def counted_past_cap(self, cell: Cell) -> bool:
        """Whether a count says the cell passes its cap, as the campaign's own count will: the one stored for the
        target, else the latest count record; for a peer whose offload a count bounds, only a count made against
        the cap plus that bound (`count_allowance_gb`) says so."""
        stored = self.precounted(cell)
        if stored is not None:
            return stored["status"] == "oom"
        rec = self.counted.get((cell.experiment, cell.row.name, "paper"))
        if rec is None or rec["status"] != "oom":
            return False
        return not get_method(cell.run.method).count_allowance(cell.run) or "count_allowance_gb" in rec["metrics"]

    def past_cap(self, cells: list[Cell]) -> dict[str, Outcome]:
        """The plan's counts on the target: an `oom` outcome for each capped cell a count puts past its cap, or whose
        host need (a count's host peak, a peer's offload) passes the target's host, as the runner's will
        (suite.core.runner.counted_past_cap)."""
        out = {}
        for c in precount.capped(cells):
            by = "a stored precount" if self.precounted(c) is not None else "a count record"
            if self.counted_past_cap(c):
                out[c.key] = failed("oom", f"counted past its cap ({by}): not run")
                continue
            count = self.precounted(c) or self.counted.get((c.experiment, c.row.name, "paper")) or {}
            need = runner.host_need(c, count)
            if need and need > self.ram - runner.HOST_RESERVE:
                out[c.key] = failed("oom", f"counted past the target's host ({need / 2**30:.0f} GiB): not run")
        return out

    def absent(self, cell: Cell) -> str | None:
        """Why the target cannot run the cell's method at all (a library its image lacks), or None: its cells are
        recorded not_implemented there without starting. The target's environment report decides where it names
        the library; else the GPU image as this suite knows it (GPU_IMAGE_LACKS)."""
        for pkg in get_method(cell.run.method).requires:
            if pkg in self.versions and self.versions[pkg] is None:
                return f"{pkg} not installed on {self.machine} (its environment report): not run"
            if pkg not in self.versions and pkg in GPU_IMAGE_LACKS:
                return f"{pkg} not in the GPU image (GPU_IMAGE_LACKS; {self.machine}'s report does not say): not run"
        return None

    def oom(self, cell: Cell) -> float | None:
        rec = self.by_cell.get((cell.experiment, cell.row.name, cell.profile))
        return rec.get("duration_s") if rec and rec["status"] == "oom" else None

    def fresh_overhead(self, params: int, init: str = "full") -> float:
        """A fresh process's start and its build of a model of `params` parameters."""
        return self.start() + self.build(params, init)

    def start(self) -> float:
        """The part of a fresh process's start that does not grow with the model (imports, CUDA's context)."""
        return self.overhead[0] if self.overhead else 0.0

    def build(self, params: int, init: str = "full") -> float:
        """The part of a fresh process's start that grows with the model: what the worker pays for a new shape, in
        the host generator's draws (DRAWS a parameter: Hugging Face's init alone, model.init=hf, makes half)."""
        _, per_draw = self.overhead or (0.0, DEFAULT_OVERHEAD_S / (BERT_LARGE_PARAMS * DRAWS["full"]))
        return per_draw * params * DRAWS[init]


BERT_LARGE_PARAMS = 335_000_000  # where the target has no record: DEFAULT_OVERHEAD_S was its fresh processes' start
# The host generator's draws a parameter of a random init: torch's default init and Hugging Face's over it, or
# Hugging Face's alone (suite.config.run.ModelConfig.init)
DRAWS = {"full": 2, "hf": 1}


def _params(run) -> int:
    """The parameters of a run's model (a RunConfig or its dict), counted once per shape on `meta`."""
    from suite.config.run import RunConfig

    return param_count((RunConfig.from_dict(run) if isinstance(run, dict) else run).model)


def _kind(machine: str) -> str | None:
    """The lent GPU kind (the machine catalogue's name) a machine's slug names, else None."""
    found = machines.of_slug(machine)
    return found.name if found and found.name in machines.LENT else None


def _overhead_point(r: Record) -> tuple[float, float] | None:
    """(host draws, seconds) of a record's process start: its duration per process less its steps; None where the
    record does not say."""
    st, rounds, run = _step_time(r), r.get("rounds") or 0, r["config"]["run"]
    if st is None or not rounds or not r.get("duration_s"):
        return None
    inside = (run.get("options") or {}).get("rounds_inside", 1)  # rounds a process measured itself
    processes, steps = rounds / inside, run["warmup"] + inside * run["steps"]
    draws = _params(run) * DRAWS[(run.get("model") or {}).get("init", "full")]
    return draws, r["duration_s"] / processes - steps * st


def _fit(points: list[tuple[float, float]], per_draw: float | None = None) -> tuple[float, float] | None:
    """(fixed s, s per draw) of a process's start from (draws, overhead) points: least squares where they span sizes
    (neither part negative); at one size, the fixed part their median less `per_draw` (another fit's) where given,
    else all of it per draw."""
    if not points:
        return None
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        if per_draw is not None:
            return max(statistics.median(y - per_draw * x for x, y in points), 0.0), per_draw
        return 0.0, statistics.median(y for _, y in points) / xs[0]
    slope, fixed = statistics.linear_regression(xs, [y for _, y in points])
    if slope < 0 or fixed < 0:
        slope = max(slope, 0.0)
        fixed = max(statistics.fmean(y for _, y in points) - slope * statistics.fmean(xs), 0.0)
    return fixed, slope


def _environment(results_dir: Path, machine: str | None) -> dict:
    path = results_dir / "campaign" / (machine or "") / "environment.json"
    return json.loads(path.read_text()) if machine and path.exists() else {}


# A stage report's part that did not finish: cut at the deadline (its `seconds`: what it ran), or not started
# because its estimate did not fit the time left (its `seconds`: that estimate). Either is a lower bound.
CUT, NOT_STARTED = "timeout", "not started"


def part_line(key: str) -> str:
    """A stage part's estimate line, from its key in the stage report (`counted_vs_measured`: `counted vs
    measured`): how the campaign finds the part's estimate."""
    return key.replace("_", " ")


def _report_seconds(results_dir: Path, machine: str | None, stage: int, key: str) -> tuple[float, bool] | None:
    """How long a stage's part took in the target's own report, and whether it was cut at the stage's deadline
    (then it needs at least that long); None where no report says."""
    if machine is None:
        return None
    path = results_dir / "campaign" / machine / f"stage-{stage}.json"
    if not path.exists():
        return None
    part = json.loads(path.read_text()).get(key)
    if not isinstance(part, dict) or not isinstance(part.get("seconds"), (int, float)):
        return None
    return part["seconds"], part.get("exit") in (CUT, NOT_STARTED)


def _tests_seconds(key: str, table: CostTable, counted_cells=None) -> tuple[float, str]:
    """A stage's pytest session where no report of the target says how long it took: its start (a process's fixed
    part) and what its tests run. The counted-against-measured test runs each of its cells (the stage's
    `counted_cells`) in a fresh process, its count beside it on the host; the L2L microbenchmarks are BENCHMARKS
    pytest-benchmark timings of at most BENCHMARK_S each and one L2L step's breakdown at BERT-base, timed
    BENCH_STEPS times."""
    if key == "counted_vs_measured" and counted_cells is not None:
        cells = counted_cells()
        seconds = table.start() + sum(
            table.fresh_overhead(_params(c.run)) + _timed(c) * table.step(c)[0] for c in cells
        )
        return seconds, f"{len(cells)} cells, each a fresh process (counted beside it); steps by FLOPs"
    if key == "bench":
        from suite.config.run import ModelConfig, RunConfig

        run = RunConfig(
            method="l2l", model=ModelConfig(preset="bert-base"), seq_len=128, micro_batch_size=32, num_micro_batches=4
        )
        step = (
            flops.per_sample(run)["hardware_flops_per_sample"]
            * run.batch_size
            / ((flops.peak_tflops(table.peak_name, "fp32") or 1.0) * 1e12 * (table.mfu_of("l2l") or DEFAULT_MFU))
        )
        seconds = table.start() + BENCHMARKS * BENCHMARK_S + table.build(_params(run)) + BENCH_STEPS * step
        return seconds, f"assumed: {BENCHMARKS} host benchmarks of at most {BENCHMARK_S:.0f} s, a BERT-base L2L step"
    return TESTS_S, "assumed"


def _bench_seconds(cell: Cell, table: CostTable) -> tuple[float, str]:
    """A benchmark in its own process: the overhead benchmark's repeats of both sides at the model's step time;
    another benchmark (its own host work) what its latest record took, the target's or another machine's (named),
    else TESTS_S / 2."""
    if cell.kind != "bench-overhead":
        key = (cell.experiment, cell.row.name, cell.profile)
        rec = table.by_cell.get(key) or table.elsewhere.get(key)
        if rec is None or not rec.get("duration_s"):
            return TESTS_S / 2, "assumed (a host benchmark)"
        took, where = rec["duration_s"], machine_of(rec)
        if where == table.machine:
            return took, "its record on the target (a host benchmark)"
        cores = ((rec.get("machine") or {}).get("cpu") or {}).get("usable_cores")
        return took, f"its record on {where} ({cores} cores; a host benchmark, the target's host unmeasured)"
    step, src = table.step(cell)
    o = cell.run.options
    repeats = _timed(cell) if o.get("compare") != "step" else cell.run.warmup + o["rounds"] * cell.run.steps
    return table.fresh_overhead(_params(cell.run)) + 2 * repeats * step, f"own process; steps {src}"


def sweep_plan(s, table: CostTable, rounds: int | None, worker: bool, results_dir: Path) -> Plan:
    """The plan the campaign's sweep `s` (suite.commands.campaign.stages.Sweep) makes on the target: the runner's own
    (suite.core.plan), from the target's records, with what the target cannot run (its environment report) and
    the counts that put capped cells past their caps (those stored for it, else the latest count record)."""
    req = s.request(rounds=rounds, worker=worker, results_dir=results_dir, as_on_gpu=True)
    machine = table.machine or table.device
    return plan(req, expand(req), machine, lambda line: None, unavailable=table.absent, past_cap=table.past_cap)


def _settled(d: Decision, table: CostTable) -> str:
    """Why a cell the plan settles without running costs nothing."""
    if d.action == REUSED:
        prov = d.outcome.get("provenance") or {}
        code = f", code {prov['code']}" if prov.get("code") else ""
        return f"its record on {table.machine} reused ({d.outcome['status']}{code})"
    if d.action == TWIN:
        return d.why
    if d.action == PAST_CAP:
        return d.outcome["error"]
    if d.action == COMPLETE:
        return "its partial record has every round: finished as it stands"
    return d.why  # not run, untouched


def estimate(
    stages: dict, device: str = "h100", rounds: int | None = None, worker: bool = True, results_dir=None, table=None
) -> list[Line]:
    """Every stage's lines (campaign.stages.STAGES): its tests, then each sweep's cells as the runner's plan
    decides them on the target (one line each, in the plan's order; a cell that runs costs its rounds in the order
    they run: round by round, grouped by shape in the worker, which keeps one model shape at a time). `table`: the
    target's CostTable where the caller made it (to report its assumptions)."""
    results_dir = Path(results_dir or paths.RESULTS_DIR)
    table = table or CostTable(device, results_dir)
    lines: list[Line] = []
    for number, stage in stages.items():
        # What the worker's pool holds and whether it has started: each stage is its own command, so a new worker
        pool = {"shape": None, "started": False}
        for flag, key in (("cuda_tests", "cuda_tests"), ("counted", "counted_vs_measured"), ("bench", "bench")):
            if getattr(stage, flag):
                took = _report_seconds(results_dir, table.machine, number, key)
                if took is not None and not took[1]:
                    seconds, src = took[0], f"stage {number}'s report on {table.machine}"
                else:
                    seconds, src = _tests_seconds(key, table, stage.counted_cells)
                    if took is not None:  # cut at the deadline there: it needs at least what it had run
                        seconds = max(seconds, took[0])
                        src = f"at least {took[0]:.0f} s (stage {number}'s report: cut, or not started); {src}"
                lines.append(Line(number, part_line(key), 1, seconds, src))
        for s in stage.sweeps:
            lines += _sweep_lines(number, sweep_plan(s, table, rounds, worker, results_dir), table, pool)
    return lines


def _sweep_lines(number: int, p: Plan, table: CostTable, pool: dict) -> list[Line]:
    """One sweep's lines: the counts of its capped cells, then a line per decision of its plan."""
    out: dict[str, Line] = {}
    capped = precount.capped([d.cell for d in p.of(*RUNS, PAST_CAP)])
    if capped:
        left = [c for c in capped if table.precounted(c) is None]
        what = f"{capped[0].experiment}: counts of its capped cells"
        if not left:
            out["counts"] = Line(number, what, 0, 0.0, "counted before for the target (results/campaign/precount)")
        else:
            src = (
                f"assumed ({len(capped) - len(left)} of {len(capped)} counted before)"
                if len(left) < len(capped)
                else "assumed"
            )
            out["counts"] = Line(number, what, 1, COUNTS_S * len(left) / len(capped), src)
    whole = set()  # an expected OOM (one round, what its record took) and benchmarks (their own cost): costed once
    for d in p.decisions:
        cell, what = d.cell, f"{d.cell.experiment}/{d.cell.row.name}"
        if d.action not in RUNS:
            out[what] = Line(number, what, 0, 0.0, _settled(d, table), decision=d.action)
        elif (oom := table.oom(cell)) is not None:
            out[what] = Line(number, what, 1, oom, "its oom record (a fresh process)", decision=d.action)
            whole.add(cell.key)
        elif not cell.spec.builds_method:
            out[what] = Line(number, what, d.rounds, *_bench_seconds(cell, table), decision=d.action)
            whole.add(cell.key)
        else:
            peer = get_method(cell.run.method).peer is not None
            out[what] = Line(number, what, d.rounds, 0.0, "", peer, d.action)
    for cells in p.passes():
        for cell in cells:
            if cell.key in whole:
                continue
            step, src = table.step(cell)
            params = _params(cell.run)
            if p.grouped and pooled(cell):
                build = table.build(params, cell.run.model.init) if shape_of(cell) != pool["shape"] else 0.0
                pool["shape"] = shape_of(cell) if 4 * params <= table.pool_limit else None  # built in FP32
                start = 0.0 if pool["started"] else table.start()
                pool["started"] = True
                cost, how = _timed(cell) * step + WORKER_CELL_S + build + start, "worker"
            else:
                cost, how = _timed(cell) * step + table.fresh_overhead(params, cell.run.model.init), "own process"
            line = out[f"{cell.experiment}/{cell.row.name}"]
            line.seconds += cost
            line.source = line.source or f"{how}; steps {src}"
    return list(out.values())


def report(lines: list[Line], device: str, assumptions: list[str] = ()) -> str:
    """Each stage's total and its lines (a cell's: the plan's decision, the rounds it runs, and the seconds of all
    of them together), then `estimated device time: N s`; `assumptions` (CostTable.assumptions) after the title."""
    out = [
        f"campaign estimate for {device} (suite/commands/campaign/estimate.py says how each figure is made)",
        *(f"  {a}" for a in assumptions),
        f"  {'part or cell':<44} {'decision':<12} {'rounds':>6} {'all rounds':>10}  how",
    ]
    total = 0.0
    for number in sorted({ln.stage for ln in lines}):
        mine = [ln for ln in lines if ln.stage == number]
        sub = sum(ln.seconds for ln in mine)
        total += sub
        out.append(f"stage {number}: {sub:.0f} s")
        out += [
            f"  {ln.what:<44} {ln.decision or '-':<12} {ln.rounds:>6} {ln.seconds:>8.1f} s  {ln.source}" for ln in mine
        ]
    peers = sum(ln.seconds for ln in lines if ln.peer)
    if peers:
        out.append(f"of which the peers' rows: {peers:.0f} s; the rest: {total - peers:.0f} s")
    out.append(f"estimated device time: {total:.0f} s")
    return "\n".join(out)
