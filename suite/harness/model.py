"""The layered view of a Hugging Face model (embed, blocks, head) through which every method runs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint
from torch import nn

from suite.config import host
from suite.config.run import ModelConfig
from suite.harness import rng
from suite.harness.data import MicroBatch
from suite.harness.kernels import fused_attention_takes

ATTN_IMPL = "suite_keyed"


def _keyed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Scaled dot-product attention whose probability dropout draws a keyed mask.

    Without dropout it defers to transformers' SDPA kernel. With dropout, where the draws take the Triton hash
    (CUDA) in 16 bits, one fused kernel (suite/harness/kernels/attention.py: online softmax, the keyed mask drawn
    inside it, nothing S x S stored); elsewhere the materialised path: scores, an FP32 softmax, the keyed dropout
    (the dropout kernel where the draws take the Triton hash), the second matmul. That is the CPU's per-sample
    generator, the eager hash the kernels are held to, and FP32 on CUDA: Triton's FP32 dot (IEEE, no tensor cores)
    is far slower than cuBLAS's FP32 matmuls (on the H100 at 1253528 Table 2's FP32 baseline, micro-batch 2 x 512,
    took 12.4 s a step through the kernel, 5.14 samples/s; at cd78134d, materialised, it measured 21.53).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if dropout == 0.0 or not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=0.0, **kwargs)
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    # A decoder's batch with nothing padded comes without a mask (LlamaFamily.mask): its attention is causal all the
    # same, as SDPA's is_causal makes it without dropout.
    causal = attention_mask is None and bool(getattr(module, "is_causal", False))
    if key.shape[1] != query.shape[1] and (key.shape[1] == 0 or query.shape[1] % key.shape[1]):
        raise ValueError(
            f"attention: {key.shape[1]} key/value heads do not divide {query.shape[1]} query heads "
            f"(query {tuple(query.shape)}, key {tuple(key.shape)})"
        )
    if rng.path_for(query.device) == "hash_triton" and fused_attention_takes(query.dtype):
        from suite.harness.kernels import attention  # imports triton: only where the kernel runs

        dtype = query.dtype
        draw = rng.hash_key(dropout, dtype)
        rng.note("hash_triton")
        rng.note("attention_triton", attention.tiles_note())
        out = attention.keyed_attention(
            query, key.to(dtype), value.to(dtype), attention_mask, scaling, dropout, draw, causal
        )  # grouped key/value heads read in place
        return out, None
    group = query.shape[1] // key.shape[1]  # grouped-query attention: each key/value head serves `group` query heads
    key, value = (t.repeat_interleave(group, dim=1) if group > 1 else t for t in (key, value))
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if causal:
        sq, sk = scores.shape[-2:]
        attention_mask = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).tril(sk - sq)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = rng.keyed_dropout(probs, dropout, True)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPL, _keyed_attention)


@dataclass
class LayerContext:
    """Per-micro-batch state every layer call needs: its key, mask, labels and loss divisor."""

    seed: int
    step: int
    offset: int
    mask: torch.Tensor | None
    mb: MicroBatch
    denom: int
    logits: torch.Tensor | None = None
    scratch: dict = field(default_factory=dict)  # what a family computes once per micro-batch (Llama's cos, sin)


class LayeredModel(nn.Module):
    """A model as an ordered list of layers: layer 0 embeds, 1..L are blocks, L+1 is the head.

    `forward_layer` is the one place a layer is called; its `module` argument lets a method run a
    copy of the layer (a device slot, a 16-bit replica) with the same semantics and keys.
    """

    def __init__(self, hf: nn.Module, cfg: ModelConfig, family):
        super().__init__()
        self.hf = hf
        self.cfg = cfg
        self.family = family
        self.layers = nn.ModuleList(family.split(hf, cfg))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_named_parameters(self, index: int) -> list[tuple[str, nn.Parameter]]:
        """(Hugging Face name, parameter) pairs of one layer, so results are keyed by HF names."""
        by_id = {id(p): n for n, p in self.hf.named_parameters()}
        return [(by_id[id(p)], p) for p in self.layers[index].parameters()]

    def gradient_free(self) -> set[str]:
        """Parameters whose gradient is zero in exact arithmetic (a key bias shifts every score of a query
        equally, and softmax ignores that), so their trajectory under Adam-type optimizers is rounding noise."""
        return self.family.gradient_free(self.hf)

    def begin(self, mb: MicroBatch, seed: int, step: int, denom: int) -> LayerContext:
        """Per-micro-batch context; the family builds the attention mask (None when nothing is padded)."""
        return LayerContext(seed, step, mb.offset, self.family.mask(mb), mb, denom)

    def forward_layer(self, index: int, x, ctx: LayerContext, module: nn.Module | None = None):
        """Run layer `index` (or a stand-in `module`) under the key (seed, step, layer, sample offset).

        Layer 0 takes the micro-batch; blocks take and return hidden states; the head returns the
        micro-batch's share of the minibatch loss (sum / denom) and keeps its logits in ctx.
        """
        module = self.layers[index] if module is None else module
        with rng.keyed(ctx.seed, ctx.step, index, ctx.offset):
            if index == 0:
                return self.family.embed(module, ctx)
            if index == self.num_layers - 1:
                # every head takes the padding mask (BERT's mean pooling reads it; the LM heads' labels mark padding)
                loss, logits = module(x, ctx.mb.labels, ctx.denom, ctx.mb.attention_mask)
                ctx.logits = None if logits is None else logits.detach()  # (a chunked LM loss makes none whole)
                return loss
            return self.family.block(module, x, ctx)

    def forward_micro_batch(self, ctx: LayerContext, recompute: bool = False) -> torch.Tensor:
        """All layers in order for one micro-batch; returns its share of the loss.

        With `recompute`, each block keeps only its input and is recomputed in the backward
        (torch.utils.checkpoint); the keyed masks make the recompute exact.
        """
        x = ctx.mb
        for i in range(self.num_layers):
            if recompute and 0 < i < self.num_layers - 1:
                x = torch.utils.checkpoint.checkpoint(self.forward_layer, i, x, ctx, use_reentrant=False)
            else:
                x = self.forward_layer(i, x, ctx)
        return x


def _keyed_dropouts(module: nn.Module) -> None:
    """Replace every nn.Dropout with a KeyedDropout of the same rate."""
    for name, child in module.named_children():
        if isinstance(child, nn.Dropout):
            setattr(module, name, rng.KeyedDropout(child.p))
        else:
            _keyed_dropouts(child)


def shape_key(cfg: ModelConfig) -> str:
    """A model's resolved shape as text: what the pool keeps one of, and what the worker and the estimate group by."""
    return repr(cfg.resolved())


def pool_limit(ram_bytes: int | None = None) -> int:
    """The largest model (parameter bytes) a worker's pool keeps, on a host of `ram_bytes` (this one's if None)."""
    if ram_bytes is None:
        ram_bytes = host.ram_bytes() or 0  # unknown: keep nothing
    return ram_bytes // 8


class ModelPool:
    """The built models a long-lived worker keeps (suite.core.worker): one shape at a time, each handed out as a deep
    copy of the pristine model with the generator state its build left, so that a cell gets bitwise what a fresh
    build gives, without the build (BERT-Large: 5.2 s to build, 0.4 s to copy on a 2-core CPU). Models past `limit`
    parameter bytes (an eighth of the host's memory: the pristine copy stays resident beside each cell's own) are
    built anew every time."""

    def __init__(self, limit: int | None = None):
        self.limit, self.key, self.model, self.rng = pool_limit() if limit is None else limit, None, None, None
        self.hits = self.builds = 0

    def get(self, cfg: ModelConfig, seed: int) -> "LayeredModel":
        import copy

        key = (shape_key(cfg), seed)
        if key != self.key:
            self.clear()
            model = _build(cfg, seed)
            self.builds += 1
            if sum(p.numel() * p.element_size() for p in model.parameters()) > self.limit:
                return model
            self.key, self.model, self.rng = key, model, torch.get_rng_state()
            return copy.deepcopy(model)
        self.hits += 1
        torch.set_rng_state(self.rng)
        return copy.deepcopy(self.model)

    def clear(self) -> None:
        self.key = self.model = self.rng = None

    def held_bytes(self) -> int:
        return 0 if self.model is None else sum(t.numel() * t.element_size() for t in self.model.state_dict().values())


POOL: ModelPool | None = None  # set by a long-lived worker; None: every build is fresh


def build_model(cfg: ModelConfig, seed: int) -> LayeredModel:
    """Build (random init from `seed`) or load (cfg.pretrained) the model and wrap it in the layered view (from the
    worker's pool, where one keeps them: the same bits)."""
    if POOL is not None:
        return POOL.get(cfg, seed)
    return _build(cfg, seed)


def param_count(cfg: ModelConfig) -> int:
    """The model's parameters, from a build on `meta` (sizes only, no memory, never from the pool), once per shape
    in a process (a plan's or an estimate's many cells ask for few shapes)."""
    shape = shape_key(cfg)
    if shape not in _PARAMS:
        with torch.device("meta"):
            _PARAMS[shape] = sum(p.numel() for p in _build(cfg, 0).parameters())
    return _PARAMS[shape]


_PARAMS: dict[str, int] = {}


def _build(cfg: ModelConfig, seed: int) -> LayeredModel:
    from suite.harness.families import FAMILIES

    _register_attention()
    cfg = cfg.resolved()
    family = FAMILIES[cfg.family]
    torch.manual_seed(seed)  # random init, or the new head of a pretrained model
    with _hf_init_only() if cfg.init == "hf" and not cfg.pretrained else contextlib.nullcontext():
        hf = family.build(cfg, ATTN_IMPL)
    _keyed_dropouts(hf)
    hf.train()
    return LayeredModel(hf, cfg, family)


@contextlib.contextmanager
def _hf_init_only():
    """torch's default init of linear, embedding and norm layers skipped (their parameters filled with NaN instead,
    which Hugging Face's init then draws over): model.init="hf". A parameter Hugging Face's init left alone would
    stay NaN, and its first step would fail on a non-finite loss. The classes are patched for the whole process while
    a model is built: models are built on the main thread, one at a time."""
    skipped = (nn.Linear, nn.Embedding, nn.LayerNorm)
    saved = [(cls, cls.reset_parameters) for cls in skipped]

    def nan(self):
        with torch.no_grad():
            for p in self.parameters(recurse=False):
                p.fill_(float("nan"))

    try:
        for cls in skipped:
            cls.reset_parameters = nan
        yield
    finally:
        for cls, fn in saved:
            cls.reset_parameters = fn


def plain_copy(model: LayeredModel, attn_implementation: str = "sdpa") -> nn.Module:
    """The same weights in an unmodified Hugging Face model (stock dropout and attention): the reference
    for the layered view's correctness and overhead."""
    import copy

    # A copy of the config: _from_config would otherwise switch the layered model's attention too.
    plain = type(model.hf)._from_config(copy.deepcopy(model.hf.config), attn_implementation=attn_implementation)
    plain.load_state_dict(model.hf.state_dict())
    return plain.train(model.training)
