"""GPipe: all forwards of a minibatch, then all backwards, then a flush; activations recomputed by default."""

from __future__ import annotations

from methods.pipeline.method import PipelineMethod, pipeline_options
from suite.core.registry import register


@register("gpipe")
class GPipe(PipelineMethod):
    """GPipe (fill/drain + flush): stashes m micro-batches per stage; recompute on as in its paper."""

    schedule_name = "gpipe"
    options = pipeline_options(recompute=True)
