"""Measure a method's steps: warm-up, timed steps (median kept), device and host memory peaks, and whether the
machine was busy meanwhile."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from suite.harness.device import synchronize
from suite.measure.contention import Watch
from suite.measure.memory import LiveBytesTracker, host_peak_bytes

METHODOLOGY_VERSION = "1"


@dataclass
class Measurement:
    """Numbers of one cell: timing over the timed steps and memory peaks."""

    step_times: list[float] = field(default_factory=list)
    samples_per_step: int = 0
    device_memory_kind: str = ""
    device_peak_allocated: int = 0
    device_peak_reserved: int = 0
    host_peak: int = 0
    pinned_host_peak: int = 0
    losses: list[float] = field(default_factory=list)
    skipped_steps: int = 0
    contention: dict = field(default_factory=dict)
    timelines: list[dict] = field(default_factory=list)  # per timed step, from methods that trace their steps

    def summary(self) -> dict[str, float | int | str]:
        med = statistics.median(self.step_times)
        return {
            "throughput": self.samples_per_step / med,
            "step_time_median": med,
            "step_time_min": min(self.step_times),
            "step_time_max": max(self.step_times),
            "timed_steps": len(self.step_times),
            "samples_per_step": self.samples_per_step,
            "memory_gb": self.device_peak_allocated / 1e9,
            "memory_reserved_gb": self.device_peak_reserved / 1e9,
            "memory_kind": self.device_memory_kind,
            "device_peak_allocated": self.device_peak_allocated,
            "device_peak_reserved": self.device_peak_reserved,
            "host_peak_gb": self.host_peak / 1e9,
            "pinned_host_peak_gb": self.pinned_host_peak / 1e9,
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "skipped_steps": self.skipped_steps,
            "contention": self.contention,
            **timeline_summary(self.timelines),
        }


def timeline_summary(timelines: list[dict]) -> dict:
    """The timed steps' timelines as their medians, key by key (`timeline`), with the device's busy share beside
    (`device_busy`, the median step's share of wall time in which the device computed); nothing without them."""
    if not timelines:
        return {}
    med = {k: statistics.median(t[k] for t in timelines) for k in timelines[0]}
    return {"timeline": {**med, "steps": len(timelines)}, "device_busy": med["device_busy"]}


def checked(stats, batch, step: str):
    """A step's stats, refused where they cannot be a measurement: a non-finite loss (the cell is an error naming the
    step), or a sample count other than the batch the harness fed (throughput is the harness's count: a method that
    says it ran 40 samples of a batch of 4 made a rate ten times too high)."""
    loss = stats.loss
    if isinstance(loss, (int, float)) and not math.isfinite(loss):
        raise FloatingPointError(f"the loss is {loss} at {step}: the step diverged or its arithmetic broke")
    if stats.samples is not None and stats.samples != batch.size:
        raise ValueError(
            f"at {step} the method reported {stats.samples} samples for a batch of {batch.size} (StepStats.samples "
            "must be the samples of the batch it was given)"
        )
    return stats


def measure(method, batches, warmup: int, steps: int, device: torch.device, cap: int | None = None) -> Measurement:
    """Warm up, time `steps` steps (median kept), and record device and host memory peaks.

    On CUDA the peaks cover warm-up and timed steps. On CPU one extra step runs under the
    live-bytes tracker (untimed: the tracker slows every op) on top of the method's resident bytes.
    """
    m = Measurement()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for k in range(warmup):
        batch = next(batches)
        checked(method.step(batch), batch, f"warm-up step {k + 1}")
    with Watch() as watch:  # the machine's load over the timed steps (suite.measure.contention)
        for k in range(steps):
            batch = next(batches)
            synchronize(device)
            t0 = time.perf_counter()
            stats = method.step(batch)
            synchronize(device)
            m.step_times.append(time.perf_counter() - t0)
            checked(stats, batch, f"timed step {k + 1}")
            m.samples_per_step = batch.size  # what the harness fed, not what the method says it ran
            m.losses.append(stats.loss)
            m.skipped_steps += int(stats.skipped)
            if (timeline := method.timeline()) is not None:
                m.timelines.append(timeline)
    m.contention = watch.finish(m.step_times)
    if device.type == "cuda":
        m.device_memory_kind = "cuda peak allocated/reserved"
        m.device_peak_allocated = torch.cuda.max_memory_allocated(device)
        m.device_peak_reserved = torch.cuda.max_memory_reserved(device)
        if hasattr(torch.cuda, "host_memory_stats"):
            m.pinned_host_peak = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    else:
        resident = method.resident_device_bytes()
        with LiveBytesTracker(limit=cap, base=resident) as tracker:
            method.step(next(batches))
        m.device_memory_kind = "cpu live-bytes tracker (resident + step peak)"
        m.device_peak_allocated = m.device_peak_reserved = resident + tracker.peak
    m.host_peak = host_peak_bytes()
    return m
