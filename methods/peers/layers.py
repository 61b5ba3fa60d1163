"""The layered model as one module for a library that wraps a root (FSDP2, DeepSpeed): its layers, one micro-batch."""

from __future__ import annotations

from torch import nn


class Layers(nn.Module):
    """Registers the layers alone (through the HF model the head's pieces would appear outside their layer) and
    runs one micro-batch's context through them, each layer called as a module so that the library's hooks fire."""

    def __init__(self, model):
        super().__init__()
        self.layers = model.layers
        self.forward_micro_batch = model.forward_micro_batch  # a bound method: the model is not a submodule

    def forward(self, ctx):
        return self.forward_micro_batch(ctx)
