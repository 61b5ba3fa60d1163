"""The layered model as one module for a library that wraps a root (FSDP2, DeepSpeed): its layers, one micro-batch."""

from __future__ import annotations

from torch import nn

from suite.core.registry import Option

RECOMPUTE = Option(
    "off",
    ("off", "on"),
    "activation checkpointing per block (keep its input, recompute it in the backward), as practitioners run this "
    "library at large micro-batches; the keyed dropout makes the recompute exact",
)


class Layers(nn.Module):
    """Registers the layers alone (through the HF model the head's pieces would appear outside their layer) and
    runs one micro-batch's context through them, each layer called as a module so that the library's hooks fire.
    With `recompute`, each block keeps only its input and runs again in the backward (torch.utils.checkpoint, as
    the suite's AMP recomputes; the library's hooks fire again there and gather the block's weights anew)."""

    def __init__(self, model, recompute: bool = False):
        super().__init__()
        self.layers = model.layers
        self.forward_micro_batch = model.forward_micro_batch  # a bound method: the model is not a submodule
        self.recompute = recompute

    def forward(self, ctx):
        return self.forward_micro_batch(ctx, recompute=self.recompute)
