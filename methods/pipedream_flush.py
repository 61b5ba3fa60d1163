"""PipeDream-Flush: 1F1B with a flush per minibatch, one weight version, at most d - s micro-batches stashed."""

from __future__ import annotations

from methods.pipeline.method import PipelineMethod, pipeline_options
from suite.core.registry import register


@register("pipedream-flush")
class PipeDreamFlush(PipelineMethod):
    """PipeDream-Flush (1F1B + flush): stage s keeps at most d - s micro-batches in flight."""

    schedule_name = "1f1b"
    options = pipeline_options(recompute=False)
