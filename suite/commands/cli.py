"""Command line: `python -m suite list | run EXPERIMENT | render [EXPERIMENT ...] | migrate | wandb | check METHOD |
plan | campaign`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading

from suite.commands.campaign.command import add_campaign
from suite.config import paths
from suite.config.errors import ConfigError
from suite.core import interrupts
from suite.core.catalogue import Catalogue, Entry


def _list(args) -> int:
    from suite.commands.listing import listing

    sys.stdout.write(listing())
    return 0


def _nodes(args, needs_node_rank: bool):
    """The nodes a multi-rank launch spans: the command-line options over SUITE_NNODES, SUITE_NODE_RANK,
    SUITE_RDZV_ENDPOINT and SUITE_RDZV_ID; validated before anything starts."""
    from suite.config.launch import Nodes

    given = {k: getattr(args, k, None) for k in ("nnodes", "node_rank", "endpoint", "rdzv_id")}
    return Nodes.from_env(**given).validate(needs_node_rank)


def _check_data_dir(exp, folder: str) -> None:
    """A --data-dir that this experiment cannot read fails in one line, before anything runs or is written."""
    from suite.core.experiment import all_experiments

    if exp.data_check is None:
        readers = ", ".join(n for n, e in all_experiments().items() if e.data_check is not None)
        raise ConfigError(f"--data-dir: {exp.name} reads no data folder; the experiments that do: {readers}")
    if not os.path.isdir(folder):
        raise ConfigError(
            f"--data-dir {folder!r} is not a folder; give the folder holding the GLUE task folders "
            "(CoLA, MRPC, RTE, SST-2, STS-B, QNLI)"
        )
    problem = exp.data_check(folder)
    if problem:
        raise ConfigError(f"--data-dir {folder!r}: {problem}")


PAPER_ON_CPU_S = 1800.0  # past this bound, a timed paper-profile sweep on a CPU asks for --yes


def _fits_this_machine(req, yes: bool) -> None:
    """Before anything runs, for a timed sweep on this machine: refuse cells on a CUDA device it does not have (each
    would start and be an error; a count needs none), and, without `yes`, a paper-profile sweep on its CPU whose
    cell-rounds may take past PAPER_ON_CPU_S (BERT-Large-size cells on its cores): say what it may take."""
    if req.measure != "time" or req.nodes.multi:
        return
    from suite.core.kinds import is_timed, kind
    from suite.core.plan import expand

    cells = expand(req)
    cuda = any(c.run.device == "cuda" for c in cells)
    # A kind that counts on fake tensors (decoder-largest's searches) computes nothing on this CPU: not asked about.
    real = [c for c in cells if c.run.device != "cuda" and not kind(c.kind).on_host]
    on_cpu = real if req.profile == "paper" and not yes else []
    if not cuda and not on_cpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    if cuda:
        raise ConfigError(
            "device=cuda was asked for, but torch sees no CUDA device on this machine: use device=cpu or auto, or "
            "--measure count to count the cells as the device would hold them"
        )
    rounds = max(req.rounds or 1, 1)
    bound = sum((req.timeout or c.timeout) * (rounds if is_timed(c.kind) else 1) for c in on_cpu)
    if bound > PAPER_ON_CPU_S:
        raise ConfigError(
            f"--profile paper on this machine's CPU times {len(on_cpu)} cell(s) at the paper's model sizes, {rounds} "
            f"round(s) each, up to {bound / 3600:.1f} h (each cell-round's timeout; cells finished before are "
            "reused): add --yes to go on, or --measure count to count their memory in minutes"
        )


def _run(args) -> int:
    from suite.commands.sweep import sweep
    from suite.core.experiment import get_experiment
    from suite.core.request import SweepRequest
    from suite.measure.contention import contended

    nodes = _nodes(args, needs_node_rank=True)
    exp = get_experiment(args.experiment)
    if args.data_dir:  # read by the GLUE experiments (in this process and, inherited, in the cells)
        _check_data_dir(exp, args.data_dir)
        os.environ[paths.GLUE_DIR_ENV] = os.path.abspath(args.data_dir)
    req = SweepRequest(
        exp,
        profile=args.profile,
        only=args.only,
        force=args.force,
        device_memory=args.device_memory,
        overrides=args.set,
        wandb_mode=args.wandb,
        timeout=args.timeout,
        rounds=args.rounds,
        nodes=nodes,
        measure=args.measure,
        worker=args.worker,
        stale=args.stale,
        contended=args.contended,
        precount=args.precount,
    )
    _fits_this_machine(req, args.yes)
    records = sweep(req)
    bad = [r for r in records if r["status"] not in ("ok", "oom", "not_implemented") or contended(r["metrics"])]
    return 1 if bad and args.strict else 0


def _migrate(args) -> int:
    import datetime

    from suite.config import paths
    from suite.records import migrate

    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    written = migrate.migrate(paths.RESULTS_DIR, today)
    for path in written:
        print(f"migrated {path}")
    print(f"{len(written)} record(s) migrated under {paths.RESULTS_DIR}/runs")
    return 0


def _wandb(args) -> int:
    from suite.config import paths
    from suite.core.experiment import get_experiment
    from suite.records import tracking
    from suite.records.schema import machine_of
    from suite.report.wandb_export import export

    exps = [get_experiment(n) for n in args.experiments]  # every name checked before anything is written
    mode = tracking.resolve_mode(None if args.mode == "auto" else args.mode)
    if mode == "off":
        raise ConfigError("--mode off: nothing to export; give offline, online or auto (online where a key is set)")
    if not tracking.installed():
        raise ConfigError("the wandb library is not installed here: `make setup` installs it (pip install wandb)")

    def chosen(rec) -> bool:
        return (
            (args.machine is None or machine_of(rec).startswith(args.machine))
            and (args.profile is None or rec.get("profile") == args.profile)
            and (args.sweep is None or rec.get("sweep") == args.sweep)
        )

    done = export(paths.RESULTS_DIR, mode, exps or None, chosen, force=args.force,
                  reports=not args.no_reports)  # fmt: skip
    if not done.chosen:
        print("no record matches; `python -m suite list` names the experiments, results/runs/ the machines")
    return 0


def _render(args) -> int:
    from suite.commands.sweep import render
    from suite.core.experiment import all_experiments, get_experiment

    names = args.experiments or sorted(all_experiments())
    for exp in [get_experiment(n) for n in names]:  # every name checked before anything is written
        render(exp)
    if not args.experiments:  # every table rendered: the README's claims at a glance too
        from suite.config import paths
        from suite.report import claims

        readme = claims.write_readme(paths.RESULTS_DIR)
        if readme is not None:
            print(f"wrote the claims table of {readme}")
        from pathlib import Path

        from suite.report import excerpts

        root = Path(paths.RESULTS_DIR).parent  # the README and docs/ beside the results folder
        pages = [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.exists()]
        for page in excerpts.write_pages(paths.RESULTS_DIR, pages):
            print(f"wrote the excerpts of {page}")
    return 0


def _check(args) -> int:
    from suite.config.launch import torchrun_command
    from suite.config.run import RunConfig, apply_overrides
    from suite.core import registry
    from suite.core.check import check, default_precision
    from suite.harness.device import resolve_device

    nodes = _nodes(args, needs_node_rank=False)
    cls = registry.get(args.method)
    args.against = args.against or cls.reference  # a method's own reference by default (2BW: its delayed one)
    registry.get(args.against)
    run = apply_overrides(RunConfig(method=args.method), args.set or [], cls.options)
    if not any(s.startswith("precision=") for s in args.set or []):
        run.precision = default_precision(args.method, resolve_device(run.device))
    world = cls.world_size(run)
    if world > 1:  # constraints of several ranks fail here, in one line, before torchrun starts them
        cls.check_config(run.validate())
        nodes.ranks_per_node(world, f"{args.method}: ")
    elif nodes.multi:
        raise ConfigError(f"{args.method} runs on one rank here: drop --nnodes (or check a multi-rank configuration)")
    if world > 1 and "RANK" not in os.environ:
        # Several ranks: the method's own torchrun check (it also proves the ranks agree).
        module = getattr(cls, "dist_check_module", None)
        if module is None:
            raise ConfigError(f"{args.method} needs {world} ranks and has no multi-rank check")
        argv = ["--method", args.method, "--against", args.against, "--steps", str(args.steps)]
        argv += [x for s in args.set or [] for x in ("--set", s)]
        return subprocess.call(torchrun_command(world, module, argv, nodes))
    result = check(run, args.against, args.steps)
    print(result.report(verbose=args.verbose))
    return 0 if result.passed else 1


# Commands whose work another room defines, found by name as methods and experiments are (never imported from
# below): the 2BW planner's search.
COMMANDS = Catalogue("command", [("plan", Entry("methods.pipeline.planner.command:plan_command"))])


def _plan(args) -> int:
    return COMMANDS.load("plan")(args)


def _node_options(p: argparse.ArgumentParser, node_rank: bool) -> None:
    g = p.add_argument_group(
        "several nodes",
        "multi-rank cells span NNODES machines (torchrun's c10d rendezvous); run the same command on each",
    )
    g.add_argument("--nnodes", type=int, metavar="K", help="machines the ranks span (default 1, or SUITE_NNODES)")
    if node_rank:
        g.add_argument(
            "--node-rank",
            type=int,
            metavar="R",
            help="this machine: 0 at the rendezvous endpoint (writes the records), 1..K-1 the others (SUITE_NODE_RANK)",
        )
    g.add_argument(
        "--rdzv-endpoint",
        dest="endpoint",
        metavar="HOST:PORT",
        help="node 0's address and a free port (SUITE_RDZV_ENDPOINT)",
    )
    g.add_argument("--rdzv-id", metavar="ID", help="the rendezvous id (prefix), the same on every node (SUITE_RDZV_ID)")


def build_parser() -> argparse.ArgumentParser:
    from suite.config.run import MEASURES

    p = argparse.ArgumentParser(prog="python -m suite", description=__doc__, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="methods, experiments and profiles").set_defaults(fn=_list)
    r = sub.add_parser("run", help="run (or resume) an experiment and write its tables")
    r.add_argument("experiment", help="an experiment name (python -m suite list)")
    r.add_argument("--profile", default="auto", help="tiny | small | paper | auto (default)")
    r.add_argument(
        "--only",
        action="append",
        metavar="ROW",
        help="run only this row, or the rows a shell pattern matches ('mrpc-*'); repeatable",
    )
    r.add_argument("--force", action="store_true", help="re-run cells that already finished")
    r.add_argument(
        "--yes", action="store_true", help="go on with a sweep that may take hours (the paper profile on a CPU)"
    )
    stale = r.add_mutually_exclusive_group()
    stale.add_argument(
        "--keep-stale",
        dest="stale",
        action="store_const",
        const="keep",
        default="measure",
        help="keep finished timed records of another code as they are (by default they are stale: measured again)",
    )
    stale.add_argument(
        "--only-stale",
        dest="stale",
        action="store_const",
        const="only",
        help="measure only the stale records (finished timed records of another code); leave every other cell",
    )
    r.add_argument(
        "--contended",
        action="store_true",
        help="measure again only the rows timed while the machine was busy (contended), with their reference",
    )
    r.add_argument("--device-memory", metavar="SIZE", help="cap the GPU's memory, e.g. 16GiB")
    r.add_argument(
        "--wandb",
        choices=["off", "offline", "online"],
        default=None,
        help="W&B mode (default: online with an API key, else offline)",
    )
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    r.add_argument("--timeout", type=float, help="seconds per cell (default: the experiment's)")
    r.add_argument(
        "--precount",
        action="store_true",
        help="count capped cells first (fake tensors, on the host's cores; stored counts of this code taken): one "
        "past its cap is recorded `oom` (counted) without running, as the GPU campaign does",
    )
    r.add_argument("--data-dir", metavar="PATH", help="folder of GLUE TSVs (task folders with train/dev.tsv)")
    r.add_argument(
        "--measure",
        choices=MEASURES,
        default="time",
        help="time: run and measure (default); count: count each cell's memory on fake tensors (no data, any machine)",
    )
    r.add_argument(
        "--strict",
        action="store_true",
        help="exit non-zero if any cell errored, timed out or was timed on a busy machine (contended)",
    )
    r.add_argument(
        "--worker",
        action="store_true",
        help="single-rank throughput cells in one long-lived process, each model shape built once (the campaign's "
        "way); default: a fresh process per cell-round",
    )
    r.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="timing rounds of each throughput cell, interleaved across the cells (default: the experiment's, 3)",
    )
    _node_options(r, node_rank=True)
    r.set_defaults(fn=_run)
    rd = sub.add_parser(
        "render", help="rewrite tables and figures (all: and the README's claims table) from the records alone"
    )
    rd.add_argument("experiments", nargs="*", metavar="EXPERIMENT", help="experiment names (default: every one)")
    rd.set_defaults(fn=_render)
    mg = sub.add_parser(
        "migrate", help="rewrite the records an earlier suite wrote as this one keeps them (suite/records/migrate.py)"
    )
    mg.set_defaults(fn=_migrate)
    wb = sub.add_parser(
        "wandb", help="log the records of results/runs/ as W&B runs, and a report per table (docs/wandb.md)"
    )
    wb.add_argument("experiments", nargs="*", metavar="EXPERIMENT", help="experiment names (default: every one)")
    wb.add_argument("--machine", metavar="SLUG", help="only records of machines whose slug starts with this")
    wb.add_argument("--profile", choices=("tiny", "small", "paper"), help="only records of this profile")
    wb.add_argument("--sweep", metavar="ID", help="only records of this sweep (a table's `sweep` column)")
    wb.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "offline", "online", "off"),
        help="auto (default): online where an API key is configured, else offline (WANDB_MODE is honoured)",
    )
    wb.add_argument("--force", action="store_true", help="write every run again, even one unchanged since the last")
    wb.add_argument("--no-reports", action="store_true", help="write the runs only, no report definitions")
    wb.set_defaults(fn=_wandb)
    c = sub.add_parser("check", help="equivalence of a method against a reference, tensor by tensor")
    c.add_argument("method", help="a registered method (python -m suite list)")
    c.add_argument(
        "--against",
        metavar="METHOD",
        help="the reference to compare with (default: the method's own, grad_accum for most, 2bw-reference for 2BW)",
    )
    c.add_argument("--steps", type=int, default=3, help="optimizer steps both methods take (default 3)")
    c.add_argument("--verbose", action="store_true", help="list every tensor's errors (else only those past the bound)")
    c.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    _node_options(c, node_rank=False)
    c.set_defaults(fn=_check)
    pl = sub.add_parser("plan", help="rank pipeline configurations (w, d, b, recompute) by predicted throughput")
    pl.add_argument("--workers", type=int, required=True, help="devices (ranks) in all: w x d")
    pl.add_argument("--batch", type=int, required=True, help="largest safe global batch")
    pl.add_argument("--memory", metavar="SIZE", help="memory per device, e.g. 16GB (default: the device spec's)")
    pl.add_argument(
        "--methods",
        nargs="+",
        default=["pipedream-2bw"],
        help="pipedream-2bw (default), pipedream-flush, gpipe, mp (inter-layer model parallelism)",
    )
    pl.add_argument("--micro-batch-sizes", default="1,2,4,8,16,32,64", help="comma-separated candidates for b")
    pl.add_argument(
        "--recompute", choices=["off", "on", "both"], default="both", help="activation recomputation to consider"
    )
    pl.add_argument(
        "--device",
        choices=["cpu", "v100"],
        default="cpu",
        help="cpu: per-layer profile measured here (cached); v100: the paper's cluster, from FLOPs",
    )
    pl.add_argument("--threads", type=int, default=1, help="threads per rank when profiling on cpu")
    pl.add_argument("--refresh", action="store_true", help="re-measure the cached profile")
    pl.add_argument("--top", type=int, default=20, help="how many configurations to print (default 20)")
    pl.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="model/run override, e.g. model.preset=bert-base"
    )
    pl.set_defaults(fn=_plan)
    add_campaign(sub)  # the GPU campaign's command, its estimate and stages: suite/commands/campaign/
    for command in sub.choices.values():  # its own usage for what it does not take
        command.set_defaults(command_parser=command)
    return p


class _Stdout:
    """This process's stdout, that outlives its reader: where the reader goes (`| head -1`), one line on stderr, and
    the run goes on with its lines dropped (its records and tables are what it is for)."""

    def __init__(self, inner):
        self.inner, self.gone = inner, False

    def _lost(self) -> None:
        if not self.gone:
            self.gone = True
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.inner.fileno())  # what is buffered drains there
            os.close(null)
            print("note: stdout's reader is gone; the run goes on, its lines no longer shown", file=sys.stderr)

    def write(self, text: str) -> int:
        try:
            return self.inner.write(text)
        except BrokenPipeError:
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self.inner.flush()
        except BrokenPipeError:
            self._lost()
            self.inner.flush()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main(argv: list[str] | None = None) -> int:
    stdout = sys.stdout
    try:
        stdout.fileno()
        sys.stdout = _Stdout(stdout)
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's capture): nothing to lose
        pass
    try:
        return _main(argv)
    finally:
        if sys.stdout is not stdout:
            sys.stdout.flush()  # through the wrapper: a reader gone by now is met here, not at the interpreter's exit
            sys.stdout = stdout


def _no_abbreviations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser` and every command's parser taking an option only by its whole name: argparse's prefix matching took
    `--profil tiny` for `--profile` (issue 65), where every other misspelling is refused and named."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)
    return parser


def _unknown(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """The unrecognized arguments, each option with the command's nearest one where there is one."""
    import difflib

    options = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    said = []
    for token in extra:
        near = difflib.get_close_matches(token.split("=")[0], options, n=1) if token.startswith("--") else []
        said.append(f"{token} (did you mean {near[0]}?)" if near else token)
    return " ".join(said)


def _main(argv: list[str] | None) -> int:
    parser = _no_abbreviations(build_parser())
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command they were given to, with its usage, not the top level's
        args.command_parser.error(
            f"unrecognized arguments: {_unknown(args.command_parser, extra)} "
            f"(python -m suite {args.command} --help lists its options)"
        )
    if paths.RESULTS_REFUSED:  # before anything is read or written
        print(f"error: {paths.RESULTS_REFUSED}", file=sys.stderr)
        return 2
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a handler
    # SIGTERM ends a run as Ctrl-C does (its cells killed, its finished rounds kept); neither inside a child's wait
    previous = interrupts.install() if main_thread else {}
    try:
        return args.fn(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder or file it could not write or read: one line (records are saved as they come)
        where = f": {exc.filename}" if exc.filename else ""
        kept = ""
        if args.command in ("run", "campaign"):
            kept = " (every record already made is saved: the same command goes on from them once this is mended)"
        print(f"error: {exc.strerror or exc}{where}{kept}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # one line, no traceback (suite.core.runner.Interrupted says what was kept)
        print(str(exc) or "interrupted: no cell was running; every record made is saved", file=sys.stderr)
        return 130
    finally:
        interrupts.restore(previous)
