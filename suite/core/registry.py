"""The Method contract and the registry of methods by name."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from suite.config.errors import ConfigError, did_you_mean
from suite.core import method_catalogue
from suite.measure.sources import locate


@dataclass(frozen=True)
class Option:
    """A method-specific setting (e.g. L2L's stash=gpu|cpu), settable with --set NAME=VALUE."""

    default: Any
    choices: tuple = ()
    help: str = ""

    def parse(self, key: str, value: Any) -> Any:
        typ = type(self.default)
        if isinstance(value, str) and typ is not str:
            try:
                value = (
                    {"true": True, "on": True, "false": False, "off": False}[value.lower()]
                    if typ is bool
                    else typ(value)
                )
            except (KeyError, ValueError):
                raise ConfigError(f"--set {key}={value!r}: expected {typ.__name__}") from None
        if self.choices and value not in self.choices:
            hint = did_you_mean(str(value), map(str, self.choices))
            raise ConfigError(f"--set {key}={value!r} is not one of {list(self.choices)}{hint}")
        return value


@dataclass
class StepStats:
    """What one optimizer step reports."""

    loss: float
    samples: int
    skipped: bool = False
    extra: dict[str, float] = field(default_factory=dict)


class Method(ABC):
    """One execution method: runs all micro-batches of a minibatch and the optimizer update per step()."""

    name: ClassVar[str] = ""
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)
    options: ClassVar[dict[str, Option]] = {}
    # True where the method changes process state that outlives its cell and suite.core.isolation cannot see (a
    # library's constant, a C extension's mode): the long-lived worker ends after its cell, the next starts fresh.
    patches_globals: ClassVar[bool] = False
    # Several ranks: does each rank take a shard of the minibatch (data parallel) or all of it (pipeline
    # stages)? And which torchrun module proves the multi-rank run equivalent (`suite check` launches it)?
    shards_batch: ClassVar[bool] = True
    # Does the method keep state on the host (L2L's param server)? A count then builds it on the `meta` device,
    # so that device and host storages differ in type and are counted apart.
    hosts_state: ClassVar[bool] = False
    # Steps after which the method's memory is steady (every lazily made buffer made): a count warms up as many.
    # 0 when the first step's peaks are the steady ones already (tested where it is claimed).
    steady_after: ClassVar[int] = 1
    dist_check_module: ClassVar[str | None] = None
    # A peer: the field's own implementation (the library named here), run beside ours, never one of ours.
    peer: ClassVar[str | None] = None
    # Whether its single-rank timed cells may share the campaign's long-lived worker (suite.core.worker) with other
    # cells: ours do; a peer only where its library leaves nothing behind in the process but its process group,
    # which the worker leaves after each cell (FSDP2 does; DeepSpeed keeps its own state and runs apart).
    shares_worker: ClassVar[bool | None] = None  # None: ours share it, peers do not
    # The optional libraries (import names) the method needs: without one, unavailable() says so, and a campaign's
    # estimate costs its cells nothing on a target whose image lacks it (suite.commands.campaign.estimate).
    requires: ClassVar[tuple[str, ...]] = ()
    # Why a count (fake tensors) cannot follow this method's step, if it cannot: its cells are then recorded
    # `not_implemented` with the reason instead of failing inside the library.
    uncounted: ClassVar[str | None] = None

    def __init__(self, model, run, device: torch.device):
        self.model, self.run, self.device = model, run, device
        self.opts = self.resolved_options(run)

    @classmethod
    def resolved_options(cls, run) -> dict:
        """Every option of the method: the run's setting, else its default."""
        return {k: run.options.get(k, o.default) for k, o in cls.options.items()}

    # The method `suite check METHOD` compares with when no --against is given.
    reference: ClassVar[str] = "grad_accum"

    @classmethod
    def world_size(cls, run) -> int:
        """How many ranks a cell of this method needs (launched with torchrun when > 1)."""
        return run.ranks

    @classmethod
    def counted_ranks(cls, run) -> list[int]:
        """The ranks a count must follow to find the worst one: data-parallel ranks hold alike, so rank 0;
        ranks that each hold a part of the model, every one."""
        return [0] if cls.shards_batch else list(range(cls.world_size(run)))

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this machine cannot run the method at all (an optional library missing), or None. A sweep records
        such a method's cells `not_implemented` with the reason and goes on; a direct run or check refuses."""
        import importlib.util

        missing = [p for p in cls.requires if importlib.util.find_spec(p) is None]
        return f"{', '.join(missing)} not installed" if missing else None

    @classmethod
    def check_config(cls, run) -> None:
        """Raise a one-line ConfigError, naming the broken constraint and a valid choice, for a run this method
        cannot take; called before any process is launched (multi-rank errors would surface in every rank)."""
        if (why := cls.unavailable()) is not None:
            raise ConfigError(f"method {run.method!r} cannot run here: {why}")
        if run.precision not in cls.precisions:
            raise ConfigError(f"method {run.method!r} runs at precision {list(cls.precisions)}, not {run.precision!r}")
        if cls.world_size(run) > 1 and cls.shards_batch and run.micro_batch_size % run.ranks:
            # Each rank takes batch/ranks samples and splits them into num_micro_batches micro-batches.
            fit = (run.micro_batch_size // run.ranks + 1) * run.ranks
            raise ConfigError(
                f"ranks={run.ranks}: each rank takes {run.batch_size}/{run.ranks} samples, which must split into "
                f"num_micro_batches={run.num_micro_batches}, so micro_batch_size={run.micro_batch_size} must be a "
                f"multiple of ranks (e.g. micro_batch_size={fit})"
            )

    @abstractmethod
    def step(self, batch) -> StepStats:
        """All micro-batches of `batch` plus the optimizer update."""

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """FP32 weights by Hugging Face name, on CPU, gathered."""

    @classmethod
    def recomputes(cls, run) -> bool:
        """Whether a step runs every block's forward twice (hardware FLOPs count it: suite.measure.flops): a run
        with `recompute` on; a method that always recomputes (L2L, from its stash) says so."""
        return str(run.options.get("recompute", "off")).lower() in ("on", "true")

    @classmethod
    def count_allowance(cls, run) -> int | None:
        """Device bytes a count on a CPU may hold that this method's run on an accelerator keeps on the host (a
        peer's offload, which fake tensors cannot follow), so that a count past the cap plus this is past the cap
        there too: 0 where the count is the device's (ours), None where it cannot say (a peer's cells then always
        run on the accelerator; suite.core.runner.counted_past_cap)."""
        return None if cls.peer else 0

    def timeline(self) -> dict[str, float] | None:
        """Where the last step's time went, for a method that traces its steps (L2L: methods.l2l.timeline), called
        by the measurement after each timed step once the device has finished it; None for the others."""
        return None

    def resident_device_bytes(self) -> int:
        """Bytes this method keeps on the device between steps (added to the CPU live-bytes tracker)."""
        return 0

    def memory_roles(self) -> dict[str, list[torch.Tensor]]:
        """The tensors a count names by role (parameters, gradients, optimizer, stash); whatever else it counts
        is an activation, stashed when a backward saved it, else transient."""
        params = list(self.model.parameters())
        return {"parameters": params, "gradients": [p.grad for p in params if p.grad is not None]}


_REGISTRY: dict[str, type[Method]] = {}


def register(name: str):
    """Class decorator adding a Method under `name`; a second method of the same name is refused."""

    def deco(cls: type[Method]) -> type[Method]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(
                f"method name {name!r} is already registered by "
                f"{_REGISTRY[name].__module__}.{_REGISTRY[name].__qualname__}"
            )
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


# Every method by name and the module that registers it (suite/core/method_catalogue.py, a list of names that no
# cell's code includes: what a line decides, its method's module, is in that cell's code already).
METHODS = method_catalogue.METHODS
PACKAGES = ("baselines", "methods")  # where an unlisted method file is looked for
_DISCOVERED = False


def _discover() -> None:
    """Import SUITE_PLUGINS' modules and every module of PACKAGES that no catalogue line names and whose source
    registers a method (read as text first: helper modules are not imported), once per process."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    load_plugins()
    plugins = set(plugin_names())
    for module, path in _candidates():
        if module not in plugins and path is not None and _registers(path):
            importlib.import_module(module)


def _registers(path: Path) -> bool:
    """Whether a module's source calls the registry's `register` (`@register("name")`, `register(name)(cls)`,
    `@registry.register(...)`), read as syntax, not imported: not `atexit.register(...)`, nor a word in a comment."""
    return _registrations(path) != set()


def _registrations(path: Path) -> set[str] | None:
    """The names a module's source registers, read as syntax: the set of literal names (empty where it registers
    none), or None where a call names its method otherwise (a variable): only importing it can tell."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            called = (isinstance(f, ast.Name) and f.id == "register") or (
                isinstance(f, ast.Attribute) and f.attr == "register" and getattr(f.value, "id", "") == "registry"
            )
            if not called:
                continue
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                return None
            names.add(arg.value)
    return names


def _candidates() -> list[tuple[str, Path | None]]:
    """SUITE_PLUGINS' modules and the unlisted modules of PACKAGES, each with its file (None where none is found)."""
    out = []
    for m in plugin_names():
        if (path := locate(m)) is None and importlib.util.find_spec(m.partition(".")[0]) is None:
            raise _no_plugin(m)  # (a plugin installed as a distribution is found, by importing it)
        out.append((m, path))
    listed = {e.where for e in (METHODS.entry(n) for n in METHODS.names())}
    for pkg_name in PACKAGES:
        spec = importlib.util.find_spec(pkg_name)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            for path in sorted(Path(root).rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                module = ".".join((pkg_name, *(parts[:-1] if parts[-1] == "__init__" else parts)))
                if module not in listed:
                    out.append((module, path))
    return out


def _seek(name: str) -> None:
    """Import the module whose source registers `name` literally (a plugin first, then an unlisted method file), read
    as syntax, so that a cell of one plugin's method never runs another's import-time code and its process loads what
    its code (suite.core.cell_code) names; where none says so literally, every candidate is imported (_discover)."""
    for module, path in _candidates():  # (a plugin named since the discovery too)
        if path is not None and name in (_registrations(path) or ()):
            importlib.import_module(module)
            if name in _REGISTRY:
                return
    _discover()


def load_all() -> None:
    """Import every method: the catalogue's modules, then any unlisted one (_discover)."""
    for module in sorted({METHODS.entry(n).where for n in METHODS.names()}):
        importlib.import_module(module)
    _discover()


def plugin_names() -> list[str]:
    """The modules SUITE_PLUGINS names (comma-separated)."""
    return [m for m in (m.strip() for m in os.environ.get("SUITE_PLUGINS", "").split(",")) if m]


def _no_plugin(mod: str) -> ConfigError:
    return ConfigError(
        f"SUITE_PLUGINS names {mod!r}, which is not an importable module: give comma-separated module names "
        "on the path (the tree, or PYTHONPATH), e.g. SUITE_PLUGINS=my_methods"
    )


def load_plugins() -> None:
    """Import the modules SUITE_PLUGINS names (comma-separated), whose methods register themselves."""
    for mod in plugin_names():
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod and not mod.startswith(f"{exc.name}."):
                raise  # the plugin is there; something it imports is not: its own traceback says what
            raise _no_plugin(mod) from None


def _find(name: str) -> type[Method] | None:
    """The class registered as `name`, importing only what it takes: its catalogue module, else the plugins and
    any unlisted method file."""
    if name not in _REGISTRY and name in METHODS:
        module = METHODS.entry(name).where
        importlib.import_module(module)
        if name not in _REGISTRY:
            raise RuntimeError(f"the method catalogue names {module} for {name!r}, which registers no such method")
    if name not in _REGISTRY:
        _seek(name)
    return _REGISTRY.get(name)


def names() -> list[str]:
    """Every method's name: the catalogue's (nothing imported for them) and any other that registers."""
    _discover()
    return sorted(set(METHODS.names()) | set(_REGISTRY))


def is_registered(name: str) -> bool:
    return _find(name) is not None


def is_loaded(name: str) -> bool:
    """Whether a method of that name is registered in this process already (nothing is imported to find out)."""
    return name in _REGISTRY


def get(name: str) -> type[Method]:
    """The Method class called `name`; a typo gets the closest names."""
    cls = _find(name)
    if cls is None:
        known = names()
        raise ConfigError(f"unknown method {name!r}{did_you_mean(name, known)}; registered methods: {', '.join(known)}")
    return cls
