"""`python -m suite plan`: the planner's ranked configurations for a model, a number of workers and a batch."""

from __future__ import annotations

from pathlib import Path

from methods.pipeline.planner import costmodel, predict
from methods.pipeline.planner.costs import Profile
from methods.pipeline.planner.profiling import cached_profile
from suite.config import paths
from suite.config.errors import ConfigError
from suite.config.run import RunConfig, apply_overrides
from suite.config.sizes import parse_size


def plan_command(args) -> int:
    """Print the profile, the question and the ranked table for the parsed `plan` arguments (see suite.commands.cli);
    0 when the best configuration fits, 1 when none does."""
    bad = [m for m in args.methods if m not in predict.SCHEDULES]
    if bad:
        raise ConfigError(f"--methods {bad}: the planner knows {sorted(predict.SCHEDULES)}")
    sizes = [int(x) for x in args.micro_batch_sizes.split(",")]
    cap = parse_size(args.memory) if args.memory else None
    run = apply_overrides(RunConfig(method="pipedream-2bw"), args.set or []).validate()
    prof = _profile(run, args.device, args.threads, args.refresh)
    preds = predict.plan(
        prof,
        args.workers,
        args.batch,
        cap,
        tuple(args.methods),
        sizes,
        (False, True) if args.recompute == "both" else (args.recompute == "on",),
    )
    cap_text = args.memory or (f"{prof.memory / 1e9:g} GB (device spec)" if prof.memory else "none")
    print(
        f"{run.model.layers} blocks, hidden {run.model.hidden}, sequence {run.seq_len}; {args.workers} workers, "
        f"global batch <= {args.batch}, memory cap {cap_text}; ranked, fitting first"
    )
    print(predict.render(preds, args.top))
    return 0 if preds and preds[0].fits else 1


def _profile(run: RunConfig, device: str, threads: int, refresh: bool) -> Profile:
    """On `cpu`, the profile measured here (cached) with the links calibrated here; on a named device, the
    profile projected from FLOPs. Says which it is."""
    if device == "cpu":
        cache = Path(paths.RESULTS_DIR) / ".cache" / "profiles"
        prof = cached_profile(run, cache, threads=threads, refresh=refresh)
        links = costmodel.load_links(cache)
        prof.p2p, prof.all_reduce = links.p2p, links.all_reduce
        print(
            f"profile: {prof.source}; links: p2p {links.p2p}, all-reduce {links.all_reduce}"
            f"{'' if costmodel.links_path(cache).exists() else ' (assumed: run `make planner-check` to calibrate)'}"
        )
        return prof
    spec = costmodel.DEVICE_SPECS[device]
    m = run.model
    prof = costmodel.analytic_profile(m.layers, m.hidden, m.heads, run.seq_len, m.vocab_size, spec)
    print(f"profile: {prof.source} (projected from FLOPs; assumptions in methods/pipeline/planner/costmodel.py)")
    return prof
