"""Whether the machine was busy while a cell was timed, measured over its timed steps and stated in its record.

A timed cell is `contended` when any of these holds (each is one of the record's `reasons`):
- **load**: the runnable tasks, sampled every SAMPLE_S while the steps run (the sampler itself not counted), had
  a median above the cores this process may use: threads were waiting for a core;
- **other processes**: processes outside the cell's session (its ranks, the worker's guard and the cell's own
  threads are inside it) used more than OTHERS_BOUND of the usable cores, and at least half a core, on average;
- **steal**: the hypervisor took more than STEAL_BOUND of the machine's CPU time;
- **spread**: the timed steps' upper quartile is more than SPREAD_BOUND times their lower one (below four steps:
  the slowest over the fastest), and they differ by more than SPREAD_FLOOR_S. The median, the figure a table
  shows, stands while fewer than half the steps are slow, so one slow step does not count; on this suite's idle
  CPU records the slowest over the fastest stays under 1.7x; the busy run that prompted this check had 69x.
Rounds merged into one record (suite.core.rounds) are contended when any round was, or when their rates lie more
than SPREAD_BOUND apart. Where /proc is missing (not Linux) only the load average and the spread are read.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from suite.harness.processes import proc_counter, session_ticks

SAMPLE_S = 0.05
OTHERS_BOUND = 0.25
STEAL_BOUND = 0.10
SPREAD_BOUND = 2.0
SPREAD_FLOOR_S = 0.02  # steps of a few milliseconds jitter by more than 2x on an idle machine: below this, no verdict
_STAT = "/proc/stat"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(busy, steal, total) clock ticks of the whole machine, from /proc/stat's first line."""
    try:
        with open(_STAT) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    steal = fields[7] if len(fields) > 7 else 0
    total = sum(fields[:8])  # guest time is already inside user time
    return total - idle, steal, total


def _runnable() -> int | None:
    return proc_counter(_STAT, "procs_running")


class Watch:
    """Samples the machine while a cell's timed steps run; `finish(step_times)` gives the record's `contention`."""

    def __init__(self):
        self.cores = usable_cores()
        self.sid = os.getsid(0)
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="contention-watch", daemon=True)

    def __enter__(self) -> Watch:
        self.load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.ticks, self.ours = _cpu_ticks(), session_ticks(self.sid)
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.wall = time.monotonic() - self.started
        self.ticks_end, self.ours_end = _cpu_ticks(), session_ticks(self.sid)
        self.load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    def _sample(self) -> None:
        while True:
            n = _runnable()
            if n is not None:
                self.samples.append(max(n - 1, 0))  # the sampler is running as it reads
            if self._stop.wait(SAMPLE_S):
                return

    def finish(self, step_times: list[float]) -> dict:
        """The figures and the verdict, as stored in a record's metrics under `contention`."""
        out: dict = {"usable_cores": self.cores, "load_1m_start": self.load_start, "load_1m_end": self.load_end}
        reasons = []
        if self.samples:
            out["runnable_median"] = statistics.median(self.samples)
            out["runnable_max"] = max(self.samples)
            if out["runnable_median"] > self.cores:
                reasons.append(f"load: {out['runnable_median']:g} runnable tasks on {self.cores} cores")
        if self.ticks and self.ticks_end and self.ours is not None and self.ours_end is not None and self.wall > 0:
            busy = (self.ticks_end[0] - self.ticks[0]) / self.hz
            ours = sum(t - self.ours.get(pid, 0) for pid, t in self.ours_end.items()) / self.hz
            others = max(busy - ours, 0.0)
            total = self.ticks_end[2] - self.ticks[2]
            out.update(
                own_cpu_s=round(ours, 3),
                others_cpu_s=round(others, 3),
                others_cores=round(others / self.wall, 3),
                steal_share=round((self.ticks_end[1] - self.ticks[1]) / total, 4) if total > 0 else 0.0,
            )
            if out["others_cores"] > max(0.5, OTHERS_BOUND * self.cores):
                reasons.append(f"other processes: {out['others_cores']:.2f} of {self.cores} cores")
            if out["steal_share"] > STEAL_BOUND:
                reasons.append(f"steal: {100 * out['steal_share']:.0f}% of the CPU time")
        if len(step_times) > 1:
            out["step_spread"] = round(step_spread(step_times), 3)
            if out["step_spread"] > SPREAD_BOUND and max(step_times) - min(step_times) > SPREAD_FLOOR_S:
                reasons.append(f"spread: the timed steps' quartiles lie {out['step_spread']:.1f}x apart")
        out.update(contended=bool(reasons), reasons=reasons)
        return out


def step_spread(step_times: list[float]) -> float:
    """How far apart the step times lie: the upper quartile over the lower (the slowest over the fastest below four
    steps). One slow step (a collection, a page fault) moves neither quartile, as it does not move the median."""
    if len(step_times) < 4:
        return max(step_times) / min(step_times)
    q1, _, q3 = statistics.quantiles(step_times, n=4)
    return q3 / q1


def apart(rates: list[float]) -> bool:
    """Whether a cell's rounds' rates lie more than SPREAD_BOUND apart: whatever the cause, no ratio of them holds."""
    return len(rates) > 1 and min(rates) > 0 and max(rates) / min(rates) > SPREAD_BOUND


def merged(per_round: list[dict], rates: list[float]) -> dict:
    """The contention of a record merged from rounds: any round's reasons, and the rounds' own spread."""
    reasons = [f"round {i}: {r}" for i, c in enumerate(per_round, 1) for r in c.get("reasons", [])]
    if apart(rates):
        reasons.append(f"rounds: their rates lie {max(rates) / min(rates):.1f}x apart")
    out = {"rounds": per_round, "contended": bool(reasons), "reasons": reasons}
    for key in ("others_cores", "runnable_median", "step_spread", "steal_share"):
        values = [c[key] for c in per_round if isinstance(c.get(key), (int, float))]
        if values:
            out[key] = max(values)
    return out


def contended(metrics: dict) -> bool:
    """Whether a record's metrics say its machine was busy while it was timed."""
    return bool((metrics.get("contention") or {}).get("contended"))
