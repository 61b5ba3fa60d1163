"""The method registry: duplicates refused, typos answered with the closest names."""

import pytest

from suite.config.errors import ConfigError
from suite.core import registry


def test_duplicate_names_are_refused():
    cls = registry.get("grad_accum")
    with pytest.raises(ValueError, match="already registered"):

        @registry.register("grad_accum")
        class Other(cls):
            pass


def test_typo_suggests_close_names():
    with pytest.raises(ConfigError, match="did you mean grad_accum"):
        registry.get("grad_acum")


def test_baselines_are_registered():
    assert {"grad_accum", "amp"} <= set(registry.names())
    assert registry.get("amp").precisions == ("fp16", "bf16")


def test_a_catalogue_refuses_a_name_entered_twice_naming_both_places():
    from suite.core.catalogue import Catalogue, Entry

    with pytest.raises(ValueError, match="entered twice: at pkg.a:X and at pkg.b:Y"):
        Catalogue("thing", [("x", Entry("pkg.a:X")), ("x", Entry("pkg.b:Y"))])


def test_duplicate_cell_kinds_are_refused():
    from suite.core.kinds import KINDS, CellKind

    with pytest.raises(ValueError, match="cell kind 'throughput' is entered twice"):
        KINDS.add("throughput", CellKind("experiments.table4:all_ranks_throughput", timed=True))
    assert KINDS.entry("throughput").where == "suite.core.cell:throughput_cell"  # the first entry stands


def test_duplicate_experiments_are_refused():
    from suite.core.catalogue import Entry
    from suite.core.experiment import EXPERIMENTS, get_experiment

    with pytest.raises(ValueError, match="experiment 'table2' is entered twice"):
        EXPERIMENTS.add("table2", Entry("experiments.table3:EXPERIMENT"))
    assert get_experiment("table2").name == "table2"


def test_an_entry_that_defines_another_name_is_refused(monkeypatch):
    from suite.core.catalogue import Catalogue, Entry
    from suite.core.experiment import EXPERIMENTS

    moved = Catalogue("experiment", [(n, EXPERIMENTS.entry(n)) for n in EXPERIMENTS.names()])
    moved.add("table2-copy", Entry("experiments.table2:EXPERIMENT"))
    monkeypatch.setattr("suite.core.experiment.EXPERIMENTS", moved)
    from suite.core.experiment import get_experiment

    with pytest.raises(ConfigError, match="defines 'table2'"):
        get_experiment("table2-copy")


def test_names_resolve_lazily_and_unknown_ones_get_the_closest():
    """Asking for one experiment imports its module alone; no module registers anything by being imported."""
    code = (
        "import sys; from suite.core.experiment import get_experiment; get_experiment('table2'); "
        "print(sorted(m for m in sys.modules if m.startswith('experiments.')))"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "experiments.table2" in out and "experiments.table7" not in out and "experiments.fig9_2bw" not in out
    from suite.core.kinds import kind

    with pytest.raises(ConfigError, match="did you mean throughput"):
        kind("througput")


def test_every_catalogue_entry_loads_and_every_experiment_module_is_entered():
    import importlib
    import pkgutil

    import experiments
    from suite.core.experiment import EXPERIMENTS, all_experiments
    from suite.core.kinds import KINDS

    assert all(callable(KINDS.load(name)) for name in KINDS.names())
    entered = {EXPERIMENTS.entry(n).where.partition(":")[0] for n in all_experiments()}
    defining = {
        i.name
        for i in pkgutil.walk_packages(experiments.__path__, prefix="experiments.")
        if hasattr(importlib.import_module(i.name), "EXPERIMENT")
    }
    assert defining == entered


def test_a_method_loads_its_own_module_alone():
    """Asking for one method imports its module alone (no peer library, no other method)."""
    import subprocess
    import sys

    code = (
        "import sys; from suite.core import registry; registry.get('amp'); registry.is_registered('l2l-cmp'); "
        "print(sorted(m for m in sys.modules if m.startswith(('methods.', 'baselines.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))
    assert {"baselines.amp", "methods.l2l.method"} <= loaded, out
    assert not [m for m in loaded if m.startswith(("methods.peers", "methods.pipe", "methods.gpipe"))], out


def test_the_method_catalogue_lists_every_method_the_packages_register_with_its_module():
    registry.load_all()
    built_in = {n: c.__module__ for n, c in registry._REGISTRY.items() if c.__module__.startswith(registry.PACKAGES)}
    assert built_in == {n: registry.METHODS.entry(n).where for n in registry.METHODS.names()}


def test_a_method_file_no_catalogue_line_names_is_found_by_name(tmp_path, monkeypatch):
    """A user's one new file registers its method when the name is first asked for; its helper modules (nothing
    registered) are never imported."""
    pkg = tmp_path / "user_methods"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mine.py").write_text(
        "from baselines.grad_accum import GradAccum\nfrom suite.core.registry import register\n\n\n"
        '@register("user-mine")\nclass Mine(GradAccum):\n    pass\n'
    )
    (pkg / "helper.py").write_text(  # a helper that says register( only in a comment and through atexit
        "# the registry's register(...) is not called here\nimport atexit\natexit.register(print)\n"
        "raise ImportError('never imported')\n"
    )
    (pkg / "dotted.py").write_text(
        "from baselines.grad_accum import GradAccum\nfrom suite.core import registry\n\n\n"
        '@registry.register("user-dotted")\nclass Dotted(GradAccum):\n    pass\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "PACKAGES", (*registry.PACKAGES, "user_methods"))
    monkeypatch.setattr(registry, "_DISCOVERED", False)
    try:
        assert registry.get("user-mine").__name__ == "Mine"
        assert {"user-mine", "user-dotted"} <= set(registry.names())
    finally:
        registry.unregister("user-mine")
        registry.unregister("user-dotted")
