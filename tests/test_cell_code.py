"""A record's code is the code its cell ran (suite.core.cell_code): a new method file stales no other cell, a method's
or a plugin's edit stales its own cells only, the harness's every cell; a fresh cell process loads nothing its code
leaves out; counts stored for a campaign follow the same rule."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_runner import make_experiment

from suite.config.paths import ROOT
from suite.core import precount, registry
from suite.core.cell_code import NOT_CODE, code_of
from suite.core.experiment import Row, get_experiment
from suite.core.plan import REUSED, RUN, STALE, expand, plan
from suite.core.recorder import Recorder
from suite.core.request import SweepRequest
from suite.measure import sources
from suite.measure.provenance import versions
from suite.measure.step import METHODOLOGY_VERSION


def _save_current(req, machine="m"):
    """An `ok` record of each of the request's cells, made by the code each runs now; the cells."""
    cells = expand(req)
    for cell in cells:
        outcome = {
            "status": "ok",
            "metrics": {"throughput": 10.0, "memory_gb": 1.0},
            "error": None,
            "provenance": {"methodology": METHODOLOGY_VERSION, **cell.code},
        }
        Recorder(req, {"slug": machine}, "s1", print).save(cell, outcome)
    return cells


def _decided(req, cells, seen=None):
    return {
        d.cell.row.name: d.action for d in plan(req, cells, "m", (seen if seen is not None else []).append).decisions
    }


def _write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text))
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)  # a new time even within one clock tick


NEW_METHOD = '''
    """A method added to the tree as one file (the probe of issue 65)."""

    from baselines.grad_accum import GradAccum
    from suite.core.registry import register


    @register("zz-probe-new")
    class ZzProbeNew(GradAccum):
        """grad_accum under another name."""
'''


def test_a_new_method_file_stales_no_other_cell_and_no_stored_count(tmp_path):
    """Adding one method file made every timed record of Table 2 stale (the tree's digest moved): now every other
    cell's code, its record and a count stored for a campaign stand as they were, and the new method is found alone."""
    req = SweepRequest(
        make_experiment([Row("ref", "grad_accum"), Row("relay", "l2l")]),
        "tiny",
        results_dir=tmp_path,
        wandb_mode="off",
    )
    cells = _save_current(req)
    table2 = {c.row.name: c.code["code"] for c in get_experiment("table2").cells("tiny", None, [], None)}
    (capped,) = precount.as_on_gpu(get_experiment("table3"), ["amp-rc-u1"])
    torch_v, transformers_v = versions()
    prov = {"torch": torch_v, "transformers": transformers_v, **precount.count_of(capped).code}
    precount.save(tmp_path, capped, {"status": "oom", "metrics": {}, "error": None, "provenance": prov})
    assert _decided(req, cells) == {"ref": REUSED, "relay": REUSED}

    added = Path(ROOT) / "methods" / "zz_probe_new_method.py"  # (ignored by git: a killed run's is never committed)
    try:
        _write(added, NEW_METHOD)
        assert _decided(req, cells) == {"ref": REUSED, "relay": REUSED}
        assert {c.row.name: c.code["code"] for c in get_experiment("table2").cells("tiny", None, [], None)} == table2
        assert precount.load(tmp_path, capped, torch_v, transformers_v)["status"] == "oom"
        assert registry.get("zz-probe-new").__module__ == "methods.zz_probe_new_method"
        mine = code_of("throughput", "zz-probe-new")["code_files"]
        assert "methods/zz_probe_new_method.py" in mine and "methods/l2l/method.py" not in mine
    finally:
        added.unlink(missing_ok=True)
        registry.unregister("zz-probe-new")
        sys.modules.pop("methods.zz_probe_new_method", None)


PLUGIN = '''
    """A plugin method outside the tree whose speed lives in a helper module beside it."""

    import time

    from baselines.grad_accum import GradAccum
    from probe_helper import PAUSE
    from suite.core.registry import register


    @register("probe-sleeper")
    class ProbeSleeper(GradAccum):
        def step(self, batch):
            time.sleep(PAUSE)
            return super().step(batch)
'''


OTHER = '''
    """Another plugin, which patches a library as it is imported: no other plugin's cell may run it."""

    import torch

    from baselines.grad_accum import GradAccum
    from suite.core.registry import register

    torch.nn.Linear.patched_by_probe_other = True


    @register("probe-other")
    class ProbeOther(GradAccum):
        pass
'''


EDITOR = '''
    """A plugin whose step edits the helper it shares with probe_sleeper, as a user saving a file mid-sweep would."""

    from pathlib import Path

    import probe_helper
    from baselines.grad_accum import GradAccum
    from suite.core.registry import register


    @register("probe-editor")
    class ProbeEditor(GradAccum):
        def step(self, batch):
            helper = Path(probe_helper.__file__)
            if "edited" not in helper.read_text():
                helper.write_text(helper.read_text() + "# edited while a cell ran\\n")
            return super().step(batch)
'''


@pytest.fixture
def sleeper(tmp_path, monkeypatch):
    """The plugin `probe_sleeper` (and its helper) on the path, named by SUITE_PLUGINS after another plugin, one that
    patches torch as it is imported."""
    where = tmp_path / "plugins"
    where.mkdir()
    _write(where / "probe_sleeper.py", PLUGIN)
    _write(where / "probe_helper.py", "PAUSE = 0.2\n")
    _write(where / "probe_other.py", OTHER)
    _write(where / "probe_editor.py", EDITOR)
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.setenv("SUITE_PLUGINS", "probe_other,probe_sleeper,probe_editor")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")])))
    yield where
    registry.unregister("probe-sleeper")
    registry.unregister("probe-other")
    registry.unregister("probe-editor")
    for name in ("probe_sleeper", "probe_helper", "probe_other", "probe_editor"):
        sys.modules.pop(name, None)


def test_a_plugins_edit_stales_its_rows_and_no_other(tmp_path, sleeper):
    """A plugin's edit (a pause of 0.2 s made 0, in the helper it imports) left its record "ok (cached)": the plugin
    was outside the tree's digest. Now its rows are measured again, naming the file, and the other rows stand."""
    req = SweepRequest(
        make_experiment([Row("ref", "grad_accum"), Row("relay", "l2l"), Row("slow", "probe-sleeper")]), "tiny",
        results_dir=tmp_path, wandb_mode="off",
    )  # fmt: skip
    cells = _save_current(req)
    helper = (sleeper / "probe_helper.py").resolve().as_posix()
    assert helper in cells[2].code["code_files"] and helper not in cells[0].code["code_files"]
    assert _decided(req, cells) == {"ref": REUSED, "relay": REUSED, "slow": REUSED}
    _write(sleeper / "probe_helper.py", "PAUSE = 0\n")
    seen: list[str] = []
    # (the reference row is measured again beside it, for its ratio: no ratio is taken across sweeps)
    assert _decided(req, cells, seen) == {"ref": RUN, "relay": REUSED, "slow": STALE}
    assert any("slow (probe-sleeper, tiny): stale" in s and f"({helper} changed)" in s for s in seen), seen


def test_the_code_follows_imports_so_a_shared_module_changes_every_cell_and_a_method_only_its_own(
    tmp_path, monkeypatch
):
    """The rule on a package of its own: a harness module two methods import, each method's own file, a new file."""
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    _write(pkg / "__init__.py", "")
    _write(pkg / "harness.py", "X = 1\n")
    _write(pkg / "one.py", "from probepkg.harness import X\n")
    _write(pkg / "two.py", "def f():\n    from . import harness\n    return harness.X\n")  # inside a function too
    monkeypatch.syspath_prepend(str(tmp_path))

    def codes():
        return {m: sources.digest(sources.files([f"probepkg.{m}"])) for m in ("one", "two")}

    first = codes()
    assert set(sources.files(["probepkg.two"])) == {
        (pkg / f).resolve().as_posix() for f in ("__init__.py", "harness.py", "two.py")
    }
    _write(pkg / "three.py", "from probepkg.harness import X\n")
    assert codes() == first  # a new file: no one's code moves
    _write(pkg / "one.py", "from probepkg.harness import X  # edited\n")
    after = codes()
    assert after["one"] != first["one"] and after["two"] == first["two"]  # a method's edit: its own cells
    _write(pkg / "harness.py", "X = 2\n")
    assert all(codes()[m] != after[m] for m in after)  # the harness's edit: every cell
    for cell in get_experiment("table2").cells("tiny", None, [], None):  # every cell of ours runs the one harness
        assert {"suite/harness/model.py", "suite/measure/step.py", "suite/core/cell.py"} <= set(cell.code["code_files"])


def test_the_code_is_the_same_whatever_the_process_loaded_before():
    """A worker that ran other methods' cells states the same code for a cell as a fresh process: rounds of both
    merge, and no other method's file is in a cell's code."""
    import methods.gpipe  # noqa: F401 — loaded here as a worker's earlier cell would have
    import methods.l2l.method  # noqa: F401

    here = code_of("throughput", "grad_accum")
    script = (
        "import json; from suite.core.cell_code import code_of; print(json.dumps(code_of('throughput', 'grad_accum')))"
    )
    fresh = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert fresh == here and not any(f.startswith("methods/") for f in here["code_files"])


LOADED = """
import json, sys
from suite.core.cell import execute
from suite.measure import sources

record = execute(json.load(open(sys.argv[1])))
loaded = set()
for name, module in list(sys.modules.items()):
    if getattr(module, "__file__", None) and (path := sources.locate(name)) is not None:
        loaded.add(sources.display(path))
print(json.dumps({"status": record["status"], "loaded": sorted(loaded), "code": record["provenance"]["code_files"]}))
"""


@pytest.mark.parametrize(
    "experiment,row,kind",
    [
        ("table2", "baseline-fp32", None),
        ("table2", "l2l-cmp", None),
        ("table2", "l2l-fp32", "count"),
        ("plugin", "", None),
    ],
)
def test_a_fresh_cell_process_loads_nothing_its_code_leaves_out(tmp_path, sleeper, experiment, row, kind):
    """What a cell process imports (the method found by its literal name, not every plugin) is inside the files its
    record names, so no edit of code a cell ran can leave its record current."""
    if experiment == "plugin":
        req = SweepRequest(make_experiment([Row("slow", "probe-sleeper")]), "tiny", results_dir=tmp_path)
        (cell,) = expand(req)
        _write(sleeper / "probe_helper.py", "PAUSE = 0\n")
    else:
        (cell,) = get_experiment(experiment).cells("tiny", [row], [], None)
    if kind:
        cell = precount.count_of(cell)
    payload = tmp_path / "cell.json"
    payload.write_text(json.dumps(cell.resolved()))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(sleeper), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", LOADED, str(payload)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    got = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else pytest.fail(out.stderr[-3000:])
    assert got["status"] == "ok"
    lists = {sources.display(sources.locate(m)) for m in NOT_CODE}  # the catalogue's names: no code a cell runs
    assert set(got["loaded"]) - lists <= set(got["code"]), sorted(set(got["loaded"]) - lists - set(got["code"]))
    assert got["code"] == cell.code["code_files"]  # and the planner states the same code for it


def test_a_file_edited_while_a_cell_runs_leaves_its_record_of_no_code(tmp_path, sleeper):
    """The files are hashed at the cell's start and end: where they differ (an edit saved mid-cell), the record
    states no code (never current: measured again) and names the files, rather than code it may not have run."""
    from suite.core.cell import execute

    (cell,) = expand(SweepRequest(make_experiment([Row("e", "probe-editor")]), "tiny", results_dir=tmp_path))
    record = execute(cell.resolved())
    helper = (sleeper / "probe_helper.py").resolve().as_posix()
    assert record["status"] == "ok" and record["provenance"]["code"] is None
    assert record["provenance"]["code_changed"] == [helper]


def test_a_worker_hands_a_cell_whose_code_changed_since_it_loaded_it_to_a_fresh_one(tmp_path, sleeper, monkeypatch):
    """A long-lived worker keeps the modules it imported: a cell whose files changed since an earlier cell of the
    worker named them runs in a fresh worker, whose record says which files (its code is then the code it ran)."""
    from suite.commands.sweep import sweep
    from suite.core.worker_client import close_shared_worker

    monkeypatch.setenv("SUITE_MACHINE", "m")
    close_shared_worker()
    _write(sleeper / "probe_helper.py", "PAUSE = 0\n")
    rows = [Row("edits", "probe-editor"), Row("after", "probe-sleeper")]
    req = SweepRequest(make_experiment(rows), "tiny", results_dir=tmp_path, wandb_mode="off", worker=True, rounds=1)
    try:
        edits, after = sweep(req, progress=lambda m: None)
    finally:
        close_shared_worker()
    helper = (sleeper / "probe_helper.py").resolve().as_posix()
    assert edits["provenance"]["code"] is None and after["status"] == "ok"
    worker = after["provenance"]["worker"]
    assert worker["job"] == 1 and worker["fresh_because"] == [f"{helper} changed since this worker ran an earlier cell"]
    assert after["provenance"]["code_files"][helper] == sources.files(["probe_helper"])[helper]
