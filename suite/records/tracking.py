"""Weights & Biases tracking: one run per result cell, one table run per sweep of an experiment."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import netrc
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from suite.config import paths
from suite.config.files import write_atomic
from suite.records.schema import Record, machine_of

MODES = ("off", "offline", "online")
PROJECT = "memtrain-suite"

# WANDB_MODE values we honour; "disabled" is W&B's spelling of our "off".
_ENV_MODES = {"disabled": "off", "offline": "offline", "online": "online"}
_warned_missing = False
INIT_TIMEOUT_S = 15.0  # an online run's start waits at most this long for W&B (its own default: 90 s)
_unreachable: list[str] = []  # why W&B could not be reached: this process logs offline from then on, said once


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    # `wandb login` stores the key in netrc under the API host; honour NETRC like wandb does.
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return bool(host) and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode(mode: str | None) -> str:
    """Map a requested mode (None/"auto"/one of MODES) to one of MODES."""
    if mode is None:
        env = _ENV_MODES.get(os.environ.get("WANDB_MODE", "").strip().lower())
        if env:
            return env
        mode = "auto"
    if mode == "auto":
        # Never go online by surprise: without a key, runs stay local for a later `wandb sync`.
        return "online" if _has_api_key() else "offline"
    if mode not in MODES:
        raise ValueError(f"invalid W&B mode {mode!r}; expected one of {', '.join(MODES)} or auto")
    return mode


def _wandb():
    """Import wandb lazily: the GPU image lacks it, and tracking must not break a run there."""
    global _warned_missing
    try:
        import wandb
    except ImportError:
        wandb, why = None, "wandb is not installed"
    else:
        # A folder named `wandb` (W&B's own offline runs, in the working folder) imports as an empty namespace
        # package where the library is not installed (the GPU image, run from the tree): not the library.
        why = "wandb is not installed (an empty `wandb` folder on the path is W&B's runs, not the library)"
        wandb = wandb if getattr(wandb, "init", None) is not None else None
    if wandb is None and not _warned_missing:
        _warned_missing = True
        print(f"warning: {why}; W&B tracking disabled", file=sys.stderr)
    return wandb


def unreachable() -> bool:
    """Whether W&B could not be reached in this process (its runs went offline from then on)."""
    return bool(_unreachable)


def installed() -> bool:
    """Whether the W&B library itself can be imported (not a folder of its runs)."""
    return _wandb() is not None


def folder(results_dir: Path | str) -> str:
    """Where W&B keeps its runs: the user's WANDB_DIR, else `wandb/` in the results folder, never the caller's
    working folder."""
    return os.environ.get("WANDB_DIR") or str(Path(results_dir) / "wandb")


def run_path(record: dict, results_dir: Path | str) -> Path | None:
    """The folder of a record's offline W&B run: the latest under its id (run_id) where W&B keeps this results
    folder's runs, else the folder an earlier suite kept in the record (`wandb_dir`, relative to the results folder)."""
    found = offline_runs(folder(results_dir), run_id(record)).get(run_id(record))
    if found:
        return found[-1]
    stored = record.get("wandb_dir")
    return None if not stored else Path(results_dir) / stored


def said(mode: str, results_dir: Path | str, runs: int) -> str | None:
    """The console's line on where a sweep's `runs` W&B runs went, and how to upload offline ones."""
    if not runs or mode == "off":
        return None
    if mode == "online":
        return f"W&B: {runs} run(s) logged to project {PROJECT}"
    where = Path(folder(results_dir)) / "wandb"  # W&B keeps its runs in a `wandb` folder of the folder it is given
    # quoted as a shell takes it (a folder with a space pasted as it is would be two arguments), its glob left open
    return (
        f"W&B: {runs} offline run(s) under {where}; to upload them: wandb sync {shlex.quote(str(where))}/offline-run-*"
    )


@contextlib.contextmanager
def _data_beside(dir: str):
    """While a run lives, W&B's data (a table's staging copy, which an offline run's later sync reads) goes beside
    its runs unless WANDB_DATA_DIR says otherwise, not under ~/.local/share; and where there is no usable home
    (HOME unset, or not writable: W&B printed some 25 lines of its own errors), its config and cache go there too.
    The environment is restored after."""
    home = os.environ.get("HOME")
    homeless = not home or not os.access(home, os.W_OK)
    wanted = {"WANDB_DATA_DIR": "data"}
    if homeless:
        wanted.update(WANDB_CONFIG_DIR="config", WANDB_CACHE_DIR="cache")
    set_here = [k for k in wanted if not os.environ.get(k)]
    for k in set_here:
        os.environ[k] = str(Path(dir) / wanted[k])
    try:
        yield
    finally:
        for k in set_here:
            os.environ.pop(k, None)


def _run(
    wandb,
    *,
    experiment: str,
    name: str,
    job_type: str,
    mode: str,
    dir: str | None,
    config: dict | None = None,
    run_id: str | None = None,
    tags: list[str] | None = None,
):
    os.makedirs(dir, exist_ok=True)
    if mode == "online" and _unreachable:
        mode = "offline"
    # Everything optional is off: each cell run should cost well under a second, and the
    # system monitor / git / code capture say nothing about a cell that already finished.
    settings = wandb.Settings(
        silent=True,
        console="off",
        x_disable_stats=True,
        x_disable_machine_info=True,
        disable_git=True,
        save_code=False,
        x_save_requirements=False,
        disable_job_creation=True,
        init_timeout=INIT_TIMEOUT_S,
    )
    args = dict(project=PROJECT, group=experiment, job_type=job_type, name=name, config=config, dir=dir, id=run_id,
                tags=tags)  # fmt: skip
    args.update(resume="allow" if run_id else None, reinit="finish_previous", settings=settings)
    try:
        return wandb.init(mode=mode, **args)
    except Exception as exc:  # noqa: BLE001 — W&B's errors for an unreachable server vary by version
        if mode != "online":
            raise
        _unreachable.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200])
        print(
            f"warning: W&B could not be reached within {INIT_TIMEOUT_S:g} s ({_unreachable[0]}); this run and "
            "every later one of this command are logged offline (`wandb sync` uploads them)",
            file=sys.stderr,
        )
        wandb.teardown()  # the failed start holds its run id in W&B's service: "run ID ... is in use" otherwise
        return wandb.init(mode="offline", **args)


ID_MAX = 64  # W&B's longest run id


def run_id(record: Record) -> str:
    """A record's W&B run id, from its machine and cell key alone: exporting the record again, or a later measurement
    of the same cell on the same machine, updates the same run and never makes a second one."""
    return safe_id(f"{machine_of(record)}-{record.get('key') or ''}")


def safe_id(raw: str) -> str:
    """`raw` as a W&B run id: itself where it is one, else its allowed characters and a digest of it (so that two
    names one rewriting would make alike, `lab.box` and `lab-box`, never share an id)."""
    rid = re.sub(r"[^A-Za-z0-9_-]", "-", raw)
    if rid == raw and len(rid) <= ID_MAX:
        return rid
    return f"{rid[: ID_MAX - 17]}-{hashlib.sha1(raw.encode()).hexdigest()[:16]}"


def offline_runs(dir: str | Path, rid: str | None = None) -> dict[str, list[Path]]:
    """The offline run folders under `dir` (W&B keeps them in its `wandb` folder), by run id, oldest first; only
    those of `rid` where given. A folder's id is its log's (`run-<id>.wandb`): its name takes a suffix where two runs
    start in one second."""
    out: dict[str, list[Path]] = {}
    named = f"offline-run-*-{glob.escape(rid)}*" if rid else "offline-run-*"  # the id in the name: no other scanned
    for path in sorted(Path(dir, "wandb").glob(named), key=lambda p: (p.stat().st_mtime, p.name)):
        for log in path.glob("run-*.wandb"):
            found = log.name.removeprefix("run-").removesuffix(".wandb")
            if rid is None or found == rid:
                out.setdefault(found, []).append(path)
    return out


@dataclass
class RunPayload:
    """One W&B run as written: its id, name, group (the experiment), job type (the method), tags, config, summary and
    history rows (each with a "step")."""

    rid: str
    name: str
    group: str
    job_type: str
    tags: list[str]
    config: dict
    summary: dict
    history: list[dict] = field(default_factory=list)

    def digest(self) -> str:
        """What the run's content comes to, to tell an export that changes nothing from one that does."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=str).encode()).hexdigest()[:20]


MANIFEST = "exported.json"  # beside the runs: each run id's digest as last written, by mode


def _manifest(dir: str | Path) -> dict:
    try:
        data = json.loads(Path(dir, MANIFEST).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _written(dir: str | Path, mode: str, rid: str) -> dict:
    """What the manifest says of run `rid` as last written in `mode`: its digest and summary keys ({} if nothing)."""
    book = _manifest(dir).get(mode)
    entry = book.get(rid) if isinstance(book, dict) else None
    return entry if isinstance(entry, dict) else {}


def unchanged(dir: str | Path, mode: str, run: RunPayload) -> bool:
    """Whether `run` was last written in `mode` with this content (and, offline, its folder is still there)."""
    if _written(dir, mode, run.rid).get("digest") != run.digest():
        return False
    return mode != "offline" or bool(offline_runs(dir, run.rid))


def log_run(run: RunPayload, mode: str, dir: str | None = None) -> str | None:
    """Write `run`: its history rows in step order, then its summary (after the history, so that a figure logged by
    round ends as the record's median). Offline, the run's earlier folders are removed once the new one is written
    (it holds the whole run: syncing it updates the same run id); the manifest beside the runs notes the content
    written. Returns the run's folder, or None when not tracked."""
    mode = resolve_mode(mode)
    if mode == "off" or (wandb := _wandb()) is None:
        return None
    dir = dir or folder(paths.RESULTS_DIR)
    earlier = offline_runs(dir, run.rid).get(run.rid, [])
    # W&B merges a resumed run's summary: a key this content no longer has (a ratio the table now withholds, a
    # suspect reason cleared) is written as null, never left standing from an earlier export
    before = {k for m in ("offline", "online") for k in _written(dir, m, run.rid).get("keys", [])}
    summary = {**dict.fromkeys(before - set(run.summary)), **run.summary}
    with _data_beside(dir):
        live = _run(wandb, experiment=run.group, name=run.name, job_type=run.job_type, mode=mode, dir=dir,
                    config=run.config, run_id=run.rid, tags=run.tags)  # fmt: skip
        try:
            for row in sorted(run.history, key=lambda r: r["step"]):
                row_ = {k: v for k, v in row.items() if k != "step" and v is not None}
                live.log(row_, step=int(row["step"]), commit=True)  # committed now: the summary below comes last
            # NaN/None are stored as null (and inf as "Infinity") by wandb itself; nothing to sanitise.
            live.summary.update(summary)
            written, wrote = str(live.settings.sync_dir), "offline" if live.offline else "online"
        finally:
            live.finish()
    if wrote == "offline":
        for old in earlier:
            if old.resolve() != Path(written).resolve():
                shutil.rmtree(old, ignore_errors=True)
    book = _manifest(dir)
    if not isinstance(book.get(wrote), dict):
        book[wrote] = {}
    book[wrote][run.rid] = {"digest": run.digest(), "keys": sorted(run.summary)}
    Path(dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(dir, MANIFEST), json.dumps(book, indent=0, sort_keys=True))
    return written


def log_table(
    *,
    experiment: str,
    columns: list[str],
    rows: list[list],
    mode: str,
    dir: str | None = None,
    config: dict | None = None,
) -> str | None:
    """Record an experiment's results table as one run per sweep (`config["sweep"]`: a resumed sweep's calls
    resume the same run id) with the sweep's config (machine, commit, profile, the experiment's settings); return
    its run directory."""
    mode = resolve_mode(mode)
    if mode == "off" or (wandb := _wandb()) is None:
        return None
    dir = dir or folder(paths.RESULTS_DIR)
    with _data_beside(dir):
        return _log_table(wandb, experiment, columns, rows, mode, dir, config)


def _log_table(wandb, experiment, columns, rows, mode, dir, config) -> str:
    sweep = (config or {}).get("sweep")
    run_id = safe_id(f"table-{experiment}-{sweep}") if sweep else None
    run = _run(
        wandb,
        experiment=experiment,
        name=f"{experiment}/table" + (f" {sweep}" if sweep else ""),
        job_type="table",
        mode=mode,
        dir=dir,
        config=config,
        run_id=run_id,
    )
    try:
        # Paper tables mix types in a column (a batch size or "NA"); W&B infers one type per column otherwise.
        table = wandb.Table(columns=list(columns), data=[list(r) for r in rows], allow_mixed_types=True)
        run.log({experiment: table})
        return str(run.settings.sync_dir)
    finally:
        run.finish()


def _leet(run_dir: str, *flags: str) -> str:
    """`wandb leet inspect` of a local run (wandb 0.31 ships no Python reader: wandb.sdk.internal.datastore is
    gone), offline and without error reporting, which keeps wandb-core from reaching a telemetry server."""
    exe = Path(sys.executable).with_name("wandb")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "wandb"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_ERROR_REPORTING": "false"}
    out = subprocess.run(
        [*cmd, "leet", "inspect", *flags, str(run_dir)], capture_output=True, text=True, env=env, timeout=120
    )
    if out.returncode != 0:
        raise RuntimeError(f"wandb leet inspect failed on {run_dir}: {out.stderr.strip()}")
    return out.stdout


def read_offline_history(run_dir: str) -> list[dict]:
    """The history rows a local run logged, in order, each with its "step" and wandb-internal "_" keys dropped."""
    rows = []
    for line in _leet(run_dir, "--json").splitlines():
        rec = json.loads(line)
        if rec.get("type") == "history":
            item = rec["history"]["item"]
            rows.append({"step": item["_step"], **{k: v for k, v in item.items() if not k.startswith("_")}})
    return rows


def read_offline_run(run_dir: str) -> dict:
    """Return {"config", "summary"} that a local run recorded, wandb-internal "_" keys dropped.

    Uses `wandb leet inspect --summary --json`, which replays the run's .wandb log offline
    (wandb 0.31 ships no Python reader: wandb.sdk.internal.datastore is gone). Quirk: keys
    whose value was recorded as null (None or NaN) are absent from its summary.
    """
    data = json.loads(_leet(run_dir, "--summary", "--json"))
    strip = lambda d: {k: v for k, v in (d or {}).items() if not k.startswith("_")}  # noqa: E731
    return {"config": strip(data.get("config")), "summary": strip(data.get("summary"))}
