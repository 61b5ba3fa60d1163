"""The GPU campaign's command (`python -m suite campaign`): its options and what each does; the stages, their
estimate and the next loan unit are this package's other modules, imported only when the command runs."""

from __future__ import annotations

import os
import sys


def add_campaign(sub) -> None:
    """The `campaign` subcommand on the face's parser (`sub`: its subparsers)."""
    g = sub.add_parser("campaign", help="the GPU campaign: one stage (or all) of the paper-profile runs on a GPU")
    g.add_argument(
        "--stage",
        default="all",
        help=_stage_help(),
    )
    g.add_argument("--dry", action="store_true", help="the CPU rehearsal at tiny shapes: every stage's plumbing")
    g.add_argument("--budget", type=float, default=540.0, help="seconds a stage may take; the rest resumes (540)")
    g.add_argument("--rounds", type=int, metavar="N", help="timing rounds per throughput cell (the experiment's)")
    g.add_argument("--out", default=os.environ.get("OUT"), help="folder for a copy of the results (default: $OUT)")
    g.add_argument(
        "--estimate",
        action="store_true",
        help="run nothing: list every stage's cells with their estimated device seconds on --device",
    )
    g.add_argument(
        "--next",
        action="store_true",
        help="run nothing: the next loan unit on --device at this code (stage 1, else one table's section), its "
        "estimate against one call's budget and its command",
    )
    g.add_argument(
        "--precount",
        action="store_true",
        help="run no stage: count the stages' capped cells as CUDA runs them, here, for the GPU to take "
        "(results/campaign/precount/; make gpu-precount runs it under the GPU image's versions)",
    )
    g.add_argument(
        "--device",
        default="h100",
        help="the machine the estimate is for: its records' prefix under results/runs/ (h100, h200)",
    )
    g.add_argument(
        "--fresh-processes",
        action="store_true",
        help="a fresh process per cell-round instead of one long-lived worker for single-rank throughput cells",
    )
    g.set_defaults(fn=run)


def _stage_help() -> str:
    """--stage's help, from the campaign's stage table itself (imported only for the campaign command's own help)."""
    if "campaign" not in sys.argv[1:3]:
        return "all, or a stage's number (`python -m suite campaign --help` lists them)"
    from suite.commands.campaign.stages import STAGES

    return "all, or one of: " + "; ".join(f"{n}: {stage.title}" for n, stage in STAGES.items())


def run(args) -> int:
    from suite.commands.campaign import precounting, stage
    from suite.commands.campaign.stages import STAGES

    if args.estimate:
        from suite.commands.campaign.estimate import CostTable, estimate, report
        from suite.config import paths

        table = CostTable(args.device, paths.RESULTS_DIR)
        lines = estimate(STAGES, args.device, args.rounds, not args.fresh_processes, table=table)
        print(report(lines, args.device, table.assumptions()))
        return 0
    if args.next:
        from suite.commands.campaign.next_unit import next_unit

        print(next_unit(args.device, rounds=args.rounds))
        return 0
    if args.precount:
        return precounting.precount_stages(args.stage)
    request = dict(dry=args.dry, budget=args.budget, rounds=args.rounds, out=args.out, worker=not args.fresh_processes)
    return stage.run(args.stage, **request)
