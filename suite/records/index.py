"""The one index over the records: results/runs/ read once, and the few questions every reader asks of it.

The plan, the runner, the tables, the claims, the trust rules, the estimate and the projections ask this index;
none of them lists or opens results/runs/ itself (the store writes and reads one file; suite/records/store.py).

- `cell(key, machine)`: this machine's record of one cell (what the plan reuses); `newer_schema` where a newer suite
  wrote it; `others(key, machine)`: other machines' records of that cell (a count any machine may reuse).
- `records()`: every current record (each machine's folder, and the flat ones that predate fingerprints).
- `latest(experiment, row, machine)`: the latest record of a row on a machine or a machine kind (a slug's prefix);
  `latest_each(machine)`: the latest of each row; `latest_of_rows(records)`: the latest of each row among some.
- `machine(kind)`: the machine catalogue's kind, with the rates a lent machine of it measured
  (suite/measure/machines.py).
- `kept(key, machine, sweep)`: the records of a cell the store kept when later sweeps replaced them.
- `history(record)`: the other records of the same row, machine, profile and device, whatever their key (what the
  trust rules hold a record to).

An index is read on its first question and kept: it reads again after this process saves a record (store.save).
`open_index(results_dir)` gives every reader of a process the same index, and a new one where a record file changed
under it (its name, time or size: another process's save).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from suite.measure import machines
from suite.records import store
from suite.records.schema import Record, machine_of, newer, status_of


@dataclass
class _File:
    """One record file as read: its record, or the warning it gets (unreadable, of another schema), and the schema of
    a newer suite where one wrote it."""

    path: Path
    record: Record | None
    warning: str | None
    newer_schema: int | None


class Index:
    """Every record under `results_dir`/runs, read once (see the module)."""

    def __init__(self, results_dir: Path):
        self.results_dir = Path(results_dir)
        self._files: dict[Path, _File] | None = None
        self._saves = -1  # store.saves when the files were read: a save in this process reads them again
        self._rows: dict[tuple, list[Record]] = {}  # the readable records (current and kept) of each row, by row_key
        self._by_row: dict[tuple, list[Record]] = {}  # the same by row_of (any machine, device, variant)
        self._current: set[int] = set()  # id() of each current record (not a kept one)
        self._kinds: dict[str, machines.Kind] = {}  # machine(): each kind's, once a read

    # reading -----------------------------------------------------------------------------------------------------

    def _read(self, path: Path) -> _File:
        said: list[str] = []
        rec = store.read(path, said.append, once_=False)
        schema = None
        if rec is None:
            try:
                raw = json.loads(path.read_text())
                schema = raw["schema"] if newer(raw) else None
            except (OSError, ValueError, TypeError, KeyError):
                schema = None
        return _File(path, rec, said[0] if said else None, schema)

    @property
    def files(self) -> dict[Path, _File]:
        if self._files is None or self._saves != store.saves:
            self._saves = store.saves
            runs = self.results_dir / "runs"
            paths = [*runs.glob("*.json"), *runs.glob("*/*.json"), *runs.glob(f"*/{store.EARLIER}/*.json")]
            self._files = {p: self._read(p) for p in sorted(paths)}
            self._rows, self._by_row, self._kinds, self._current = {}, {}, {}, set()
            for path, f in self._files.items():
                if f.record is not None:
                    self._rows.setdefault(row_key(f.record), []).append(f.record)
                    self._by_row.setdefault(row_of(f.record), []).append(f.record)
                    if path.parent.name != store.EARLIER:
                        self._current.add(id(f.record))
        return self._files

    def _say(self, files: Iterable[_File], warn: Callable[[str], None]) -> None:
        for f in files:
            if f.warning:
                store.once(warn, f.path, f.warning)

    def _current_files(self) -> list[_File]:
        return [f for f in self.files.values() if f.path.parent.name != store.EARLIER]

    # the questions -----------------------------------------------------------------------------------------------

    def records(self, warn: Callable[[str], None] = print) -> list[Record]:
        """Every readable current record, in the order of their files (a warning for each file that is not one)."""
        files = self._current_files()
        self._say(files, warn)
        return [f.record for f in files if f.record is not None]

    def cell(self, key: str, machine: str, warn: Callable[[str], None] = print) -> Record | None:
        """This machine's record of cell `key`; records of other machines are never reused."""
        f = self.files.get(store.run_path(self.results_dir, key, machine))
        if f is None:
            return None
        self._say([f], warn)
        return f.record

    def newer_schema(self, key: str, machine: str) -> int | None:
        """The schema of this machine's record of `key` where a newer suite wrote it (left untouched), else None."""
        f = self.files.get(store.run_path(self.results_dir, key, machine))
        return f.newer_schema if f is not None else None

    def others(self, key: str, machine: str) -> list[Record]:
        """Other machines' records of cell `key` (a count's, which no machine's load or CPU decides)."""
        return [
            f.record
            for f in self._current_files()
            if f.record is not None and f.path.name == f"{key}.json" and f.path.parent.name not in (machine, "runs")
        ]

    def kept(self, key: str, machine: str, sweep: str | None = None) -> list[Record]:
        """This machine's `ok` records of cell `key` made in earlier sweeps and replaced by later ones (the store
        keeps them: store.EARLIER), all of them or the one of `sweep`."""
        folder = store.run_path(self.results_dir, key, machine).parent / store.EARLIER
        name = f"{key}.{sweep}.json" if sweep else None
        return [
            f.record
            for path, f in self.files.items()
            if f.record is not None
            and f.record.get("status") == "ok"  # (a partial one set aside holds rounds, no reference)
            and path.parent == folder
            and (path.name == name if name else path.name.startswith(f"{key}."))
        ]

    def latest(
        self,
        experiment: str,
        row: str,
        machine: str,
        profile: str = "paper",
        where: Callable[[Record], bool] | None = None,
        order: Callable[[Record], object] | None = None,
    ) -> Record | None:
        """The latest current record of experiment/row at `profile` on a machine whose slug starts with `machine` (a
        slug, or a kind's prefix: `h100-`) that `where` accepts; `order` ranks candidates (default: when finished)."""
        self.files  # noqa: B018 (read, or read again after a save)
        found = [
            rec
            for rec in self._by_row.get((experiment, row, profile), [])
            if id(rec) in self._current and machine_of(rec).startswith(machine) and (where is None or where(rec))
        ]
        rank = order or (lambda r: str(r.get("finished") or ""))
        best = None
        for rec in found:  # of two ranked alike, the later file's (as latest_of_rows)
            if best is None or rank(rec) >= rank(best):
                best = rec
        return best

    def machine(self, name: str) -> machines.Kind:
        """The catalogue's kind `name`, each rate a lent machine of it measured in place of the assumed one: its latest
        finished `bench-link` record at `paper`, as the table defines it (machines.measured names it)."""
        self.files  # noqa: B018 (read, or read again after a save: the kinds with it)
        if name in self._kinds:
            return self._kinds[name]
        kind = machines.kind(name)
        rec = kind.slug and self.latest(
            "bench-link",
            "block",
            kind.slug,
            where=lambda r: (
                status_of(r).kind == "ok"
                and not r.get("variant")
                and getattr(machines.of_slug(machine_of(r)), "name", None) == name  # not another kind's slug
                and isinstance((r.get("metrics") or {}).get("h2d_gbps"), (int, float))
            ),
        )
        if rec:
            kind = machines.measured(
                kind, rec["metrics"], f"measured: bench-link on {machine_of(rec)}, {str(rec['finished'])[:10]}"
            )
        update = kind.rates.get("host_update_ns")
        if update is None or not update.source.startswith("measured"):
            kind = self._host_update(kind)
        self._kinds[name] = kind
        return kind

    def _host_update(self, kind: machines.Kind) -> machines.Kind:
        """`kind` with its host update a parameter as a lent machine of it measured the suite's fused AdamW on FP32
        gradients over a whole layer at all its threads (bench-host-optim's layer-all-threads, any profile), where
        no bench-link record measured L2L's own: the one-pass commit moves the same 28 bytes a parameter at torch's
        fused AdamW's speed (bench-host-optim's ratios on the CPUs that ran both)."""

        def usable(r: Record) -> bool:
            return (
                status_of(r).kind == "ok"
                and not r.get("variant")
                and getattr(machines.of_slug(machine_of(r)), "name", None) == kind.name
                and isinstance((r.get("metrics") or {}).get("adamw_fused_ns_per_param"), (int, float))
            )

        found = [
            self.latest("bench-host-optim", "layer-all-threads", kind.slug, profile=p, where=usable)
            for p in ("paper", "small")  # BERT-Large's layer or BERT-base's (tiny's is no measure of a host)
        ]
        found = [r for r in found if r]
        if not kind.slug or not found:
            return kind
        rec = max(found, key=lambda r: str(r.get("finished") or ""))
        m = rec["metrics"]
        where = (
            f"measured: bench-host-optim on {machine_of(rec)}, {str(rec['finished'])[:10]} (the suite's fused AdamW "
            f"over a layer of {(m.get('numel') or 0) / 1e6:.1f}M parameters at {m.get('threads')} threads)"
        )
        return machines.measured(kind, {"host_ns_per_param": m["adamw_fused_ns_per_param"]}, where)

    def latest_each(self, machine: str = "", where: Callable[[Record], bool] | None = None) -> dict[tuple, Record]:
        """The latest current record of each row (experiment, row, profile) on a machine whose slug starts with
        `machine` (every machine: ""), among those `where` accepts; of two finished at once, the later file's."""
        return latest_of_rows(r for r in self.records(warn=lambda _: None) if machine_of(r).startswith(machine)
                              and (where is None or where(r)))  # fmt: skip

    def history(self, record: Record) -> list[Record]:
        """Every other record of `record`'s row (experiment, row, profile, variant) on its machine and device with
        figures (finished, or partial: its measured rounds), whatever its cell key: the current records of other keys
        and the kept ones alike, oldest first."""
        self.files  # noqa: B018 (read, or read again after a save)
        me = (record.get("key"), record.get("sweep"), record.get("finished"))
        found = [
            rec
            for rec in self._rows.get(row_key(record), [])
            if (rec.get("key"), rec.get("sweep"), rec.get("finished")) != me
            and (status_of(rec).finished or status_of(rec).measured)
            and not rec.get("set_aside")  # a partial set aside: its rounds are kept, not a row's latest figure
        ]
        return sorted(found, key=lambda r: str(r.get("finished") or ""))


def row_of(record: Record) -> tuple:
    """A record's row: (experiment, row, profile)."""
    return record.get("experiment"), record.get("row"), record.get("profile")


def row_key(record: Record) -> tuple:
    """A record's row as its table's section holds it: experiment, row, profile, then variant, machine and device."""
    return (*row_of(record), record.get("variant") or "", machine_of(record), record.get("device_type"))


def latest_of_rows(records: Iterable[Record]) -> dict[tuple, Record]:
    """The latest (by `finished`) of `records` for each row (row_of); of two finished at once, the later one's."""
    out: dict[tuple, Record] = {}
    for r in records:
        if str(r.get("finished") or "") >= str(out.get(row_of(r), {}).get("finished") or ""):
            out[row_of(r)] = r
    return out


_open: dict[Path, tuple[tuple, Index]] = {}


def _signature(results_dir: Path) -> tuple:
    """What changes when a record file is added, rewritten or removed: each file's name, time and size."""
    runs = results_dir / "runs"
    out = []
    for path in [*runs.glob("*.json"), *runs.glob("*/*.json"), *runs.glob(f"*/{store.EARLIER}/*.json")]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(sorted(out))


def open_index(results_dir: Path) -> Index:
    """The index of `results_dir` for this process: read once, read again after a save or a change under it."""
    where = Path(results_dir).resolve()
    sig = _signature(where)
    held = _open.get(where)
    if held is None or held[0] != sig:
        held = _open[where] = (sig, Index(where))
    return held[1]
