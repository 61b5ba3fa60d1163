"""Typed run and model configs, model presets, and validated `key=value` overrides."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from suite.config.errors import ConfigError, did_you_mean
from suite.config.sizes import parse_size

MEASURES = ("time", "count")  # how a sweep reads memory: timed on the device, or counted on fake tensors

PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("lamb", "adamw")
SCHEDULES = ("constant", "linear")
DEVICES = ("auto", "cpu", "cuda")
FAMILIES = ("bert", "bert-mlm", "gpt2", "llama")  # suite.harness.families.FAMILIES holds their implementations
POOLINGS = ("cls", "mean")  # what BERT's pooler reads (ModelConfig.pooling)
INITS = ("full", "hf")  # a random init's draws (ModelConfig.init)

LLAMA = dict(family="llama", vocab_size=128256, dropout=0.0, attention_dropout=0.0)
# What a preset with a family sets whenever the config leaves it at its default.
FAMILY_DEFAULTS = ("family", "dropout", "attention_dropout")

# Model presets. `bert-large` is exactly the L2L paper's Table 1.
PRESETS: dict[str, dict[str, Any]] = {
    "bert-large": dict(layers=24, hidden=1024, intermediate=4096, heads=16, max_seq=512, vocab_size=30522),
    "bert-base": dict(layers=12, hidden=768, intermediate=3072, heads=12, max_seq=512, vocab_size=30522),
    # GPT-2 medium, the 355M-parameter GPT of the 2BW paper's section 5.1.
    "gpt2-medium": dict(layers=24, hidden=1024, intermediate=4096, heads=16, max_seq=1024, vocab_size=50257),
    "tiny": dict(layers=4, hidden=64, intermediate=256, heads=4, max_seq=128, vocab_size=1024),
    "tiny-wide": dict(layers=4, hidden=128, intermediate=512, heads=4, max_seq=128, vocab_size=1024),
    # Llama-style decoders at their published shapes (a preset with a family sets it, and no dropout): Llama 3.2 1B
    # and 3B, Llama 3 8B and 70B; untied embeddings and 128256 tokens throughout. `llama-tiny` is for tests: grouped
    # queries (4 heads over 2 key-value heads) as the real ones.
    "llama-tiny": dict(LLAMA, layers=4, hidden=64, intermediate=160, heads=4, kv_heads=2, max_seq=128, vocab_size=1024),
    "llama-1b": dict(LLAMA, layers=16, hidden=2048, intermediate=8192, heads=32, kv_heads=8, max_seq=131072),
    "llama-3b": dict(LLAMA, layers=28, hidden=3072, intermediate=8192, heads=24, kv_heads=8, max_seq=131072),
    "llama-8b": dict(LLAMA, layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, max_seq=8192),
    "llama-70b": dict(LLAMA, layers=80, hidden=8192, intermediate=28672, heads=64, kv_heads=8, max_seq=8192),
    # Llama 2 7B's shape: multi-head attention (as many key-value heads as queries), its 32000-token vocabulary
    "llama2-7b": dict(LLAMA, layers=32, hidden=4096, intermediate=11008, heads=32, max_seq=4096, vocab_size=32000),
}


@dataclass
class ModelConfig:
    """Which transformer to build: a preset, optionally overridden, or a pretrained folder."""

    family: str = "bert"
    preset: str = "tiny"
    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    heads: int | None = None
    kv_heads: int | None = None  # grouped-query attention's key-value heads (llama); None: as many as heads
    max_seq: int | None = None
    vocab_size: int | None = None
    num_labels: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.1
    pretrained: str | None = None
    # What BERT's pooler reads: "cls" (the [CLS] token, BertForSequenceClassification's) or "mean" (the mean of
    # the unpadded tokens, a sentence-transformers checkpoint's own pooling).
    pooling: str = "cls"
    # Tokens whose LM-head logits are made at a time in training (llama): None decides by size (chunks of
    # suite.harness.families.lm.LOSS_CHUNK once a micro-batch's FP32 logits would pass LOGITS_BYTES), 0 never.
    loss_chunk: int | None = None
    # A random init's draws: "full" (torch's default init of each layer, then Hugging Face's over it: the bits every
    # earlier record was built from) or "hf" (Hugging Face's alone, torch's skipped for linear, embedding and norm
    # layers: the same distributions and half the draws of the host's serial generator, other bits; Llama 3 8B's
    # build takes about a third as long; GPT-2's Conv1D layers keep both).
    init: str = "full"

    def resolved(self) -> "ModelConfig":
        """Fill every size from the preset; explicit values win."""
        if self.family not in FAMILIES:
            raise ConfigError(
                f"model.family={self.family!r} is not one of {list(FAMILIES)}{did_you_mean(self.family, FAMILIES)}"
            )
        if self.preset not in PRESETS:
            raise ConfigError(
                f"model.preset={self.preset!r} is not one of {sorted(PRESETS)}{did_you_mean(self.preset, PRESETS)}"
            )
        base = PRESETS[self.preset]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        out = dataclasses.replace(
            self,
            **{
                k: v
                for k, v in base.items()
                if getattr(self, k) is None or (k in FAMILY_DEFAULTS and getattr(self, k) == defaults[k])
            },
        )
        if "family" in base and out.family != base["family"]:
            raise ConfigError(
                f"model.preset={self.preset!r} is a {base['family']} model, not model.family={out.family!r}"
            )
        if out.hidden % out.heads:
            raise ConfigError(f"model.hidden={out.hidden} must be a multiple of model.heads={out.heads}")
        if out.kv_heads is not None and (out.kv_heads < 1 or out.heads % out.kv_heads):
            raise ConfigError(f"model.heads={out.heads} must be a multiple of model.kv_heads={out.kv_heads}")
        if out.kv_heads is not None and out.family != "llama":
            raise ConfigError(f"model.kv_heads applies to model.family='llama' only, not {out.family!r}")
        for k in ("layers", "hidden", "intermediate", "heads", "max_seq", "vocab_size", "num_labels"):
            if getattr(out, k) < 1:
                raise ConfigError(f"model.{k} must be >= 1, got {getattr(out, k)}")
        if out.pooling not in POOLINGS:
            raise ConfigError(
                f"model.pooling={out.pooling!r} is not one of {list(POOLINGS)}{did_you_mean(out.pooling, POOLINGS)}"
            )
        if out.pooling != "cls" and out.family != "bert":
            raise ConfigError(f"model.pooling={out.pooling!r} applies to model.family='bert' only, not {out.family!r}")
        for k in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(out, k) < 1.0:
                raise ConfigError(f"model.{k} must be in [0, 1), got {getattr(out, k)}")
        if out.init not in INITS:
            raise ConfigError(f"model.init={out.init!r} is not one of {list(INITS)}{did_you_mean(out.init, INITS)}")
        if out.loss_chunk is not None and (out.loss_chunk < 0 or out.family != "llama"):
            raise ConfigError(
                f"model.loss_chunk={out.loss_chunk} must be tokens >= 0 (0: never chunked) on model.family='llama'"
                f" (this is {out.family!r})"
            )
        return out


@dataclass
class RunConfig:
    """Everything one method run needs: model, batch shape, optimizer, precision, steps, device."""

    method: str = "grad_accum"
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: str = "fp32"
    micro_batch_size: int = 4
    num_micro_batches: int = 2
    seq_len: int = 32
    optimizer: str = "lamb"
    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    clip_grad_norm: float = 0.0
    seed: int = 1234
    warmup: int = 2
    steps: int = 5
    device: str = "auto"
    device_memory: str | None = None
    ranks: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        """Samples per optimizer step on one rank (micro-batch size x number of micro-batches)."""
        return self.micro_batch_size * self.num_micro_batches

    def validate(self) -> "RunConfig":
        """Check enumerations and ranges; returns a copy with the model resolved."""
        for name, choices in (
            ("precision", PRECISIONS),
            ("optimizer", OPTIMIZERS),
            ("schedule", SCHEDULES),
            ("device", DEVICES),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"{name}={value!r} is not one of {list(choices)}{did_you_mean(str(value), map(str, choices))}"
                )
        for name in ("micro_batch_size", "num_micro_batches", "seq_len", "steps", "ranks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.warmup_steps < 0 or self.total_steps < 0:
            raise ConfigError("warmup, warmup_steps and total_steps must be >= 0")
        for name, value in _floats(self):
            if not math.isfinite(value):
                raise ConfigError(f"{name}={value}: give a finite number")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        model = self.model.resolved()
        if self.seq_len > model.max_seq:
            raise ConfigError(f"seq_len={self.seq_len} exceeds model.max_seq={model.max_seq}")
        if self.device_memory is not None:
            parse_size(self.device_memory)
        return dataclasses.replace(self, model=model)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["model"]["pooling"] == "cls":  # the default stays out, so cells keyed before it existed keep their keys
            del d["model"]["pooling"]
        for k in ("kv_heads", "loss_chunk"):  # likewise
            if d["model"][k] is None:
                del d["model"][k]
        if d["model"]["init"] == "full":  # likewise
            del d["model"]["init"]
        if "family" in PRESETS.get(self.model.preset, {}):  # what the preset sets, as it resolves
            m = self.model.resolved()
            d["model"].update({k: getattr(m, k) for k in FAMILY_DEFAULTS})
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "RunConfig":
        d = dict(d)
        d["model"] = ModelConfig(**d.get("model", {}))
        return RunConfig(**d)


def _floats(cfg: "RunConfig"):
    """Every float setting of `cfg` by its --set name: the run's, the model's and the method's options."""
    for f in dataclasses.fields(cfg):
        if isinstance(getattr(cfg, f.name), float):
            yield f.name, getattr(cfg, f.name)
    for f in dataclasses.fields(cfg.model):
        if isinstance(getattr(cfg.model, f.name), float):
            yield f"model.{f.name}", getattr(cfg.model, f.name)
    yield from ((k, v) for k, v in cfg.options.items() if isinstance(v, float))


def _field_type(cls, name: str):
    hints = typing.get_type_hints(cls)
    return hints[name]


def _coerce(key: str, raw: str, typ) -> Any:
    """Convert the text of an override to the field's declared type."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        if type(None) in args and raw.lower() in ("none", "null", ""):
            return None
        typ = next(a for a in args if a is not type(None))
    try:
        if typ is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if typ is str:
            return raw
    except ValueError:
        pass
    raise ConfigError(f"--set {key}={raw!r}: expected a value of type {getattr(typ, '__name__', typ)}")


def override_keys() -> list[str]:
    """Every key `--set` accepts besides method options."""
    run = [f.name for f in dataclasses.fields(RunConfig) if f.name not in ("model", "options")]
    model = [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)]
    return run + model


def apply_overrides(cfg: RunConfig, pairs: list[str] | dict[str, Any], method_options: dict | None = None) -> RunConfig:
    """Apply `key=value` overrides. Keys: RunConfig fields, `model.<field>`, or the method's declared options."""
    items = pairs.items() if isinstance(pairs, dict) else [_split_pair(p) for p in pairs]
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"model", "options"}
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model), options=dict(cfg.options))
    for key, value in items:
        raw = value if isinstance(value, str) else None
        if key.startswith("model.") and key[6:] in model_fields:
            typ = _field_type(ModelConfig, key[6:])
            setattr(cfg.model, key[6:], _coerce(key, raw, typ) if raw is not None else value)
        elif key in run_fields:
            setattr(cfg, key, _coerce(key, raw, _field_type(RunConfig, key)) if raw is not None else value)
        elif method_options is not None and key in method_options:
            cfg.options[key] = method_options[key].parse(key, value)
        else:
            accepted = override_keys() + sorted(method_options or {})
            raise ConfigError(
                f"unknown --set key {key!r}{did_you_mean(key, accepted)}; accepted keys: {', '.join(accepted)}"
            )
    return cfg


def _split_pair(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()
