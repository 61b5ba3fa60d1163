"""L2L Tables 3-6: definitions expand into valid cells at every profile, carry the paper's values, and one runs."""

import dataclasses
import os

import pytest

from experiments import l2l_common, table5, table6
from suite.commands.sweep import sweep
from suite.config.errors import ConfigError
from suite.config.run import ModelConfig
from suite.core import registry
from suite.core.experiment import get_experiment
from suite.core.request import SweepRequest
from suite.harness.model import build_model

TABLES = ("table3", "table4", "table5", "table6")
# The L2L paper's text, where SUITE_PAPERS_DIR names the folder that holds it (docs/data.md): a clone has none.
PAPER_TEXT = os.path.join(os.environ.get("SUITE_PAPERS_DIR", "/nonexistent"), "l2l-constant-memory.txt")


@pytest.mark.parametrize("profile", ["tiny", "small", "paper"])
@pytest.mark.parametrize("name", TABLES)
def test_every_profile_expands_into_valid_cells(name, profile):
    exp = get_experiment(name)
    rows = exp.rows(profile)
    assert exp.baseline in [r.name for r in rows]
    assert len({r.name for r in rows}) == len(rows)
    cells = exp.cells(profile)
    ran = {c.row.name for c in cells}
    for row in rows:  # a row without a cell says why
        assert row.name in ran or row.labels["note"].startswith("not run: "), row.name
    for cell in cells:
        cls = registry.get(cell.run.method)
        assert cell.run.precision in cls.precisions
        assert set(cell.run.options) <= set(cls.options)
        assert cell.run.batch_size % cell.run.ranks == 0
    assert len({c.key for c in cells}) == len(cells)


def _paper_table(number: int) -> list[list[str]]:
    """The numeric lines of the paper's Table `number`, split on tabs."""
    text = open(PAPER_TEXT).read()
    block = text.split(f"Table {number}:")[1].split("\n\n", 2)[1]
    return [line.split("\t") for line in block.splitlines()[1:] if "\t" in line]  # the header first


@pytest.mark.skipif(not os.path.exists(PAPER_TEXT), reason="SUITE_PAPERS_DIR names no folder with the L2L paper's text")
def test_paper_values_are_the_papers():
    t3 = {r.name: r.paper for r in get_experiment("table3").rows("paper")}
    for ub, n, _, thr, mem in _paper_table(3):
        assert t3[f"l2l-cmp-u{n}"] == {"throughput": float(thr), "memory_gb": float(mem)}
    t4 = {(r.labels["paper #GPUs"], r.labels["#uBatches"]): r.paper for r in get_experiment("table4").rows("tiny")}
    for gpus, _, n, _, thr in _paper_table(4):
        assert t4[(int(gpus), int(n))] == {"throughput": float(thr)}
    t5 = {
        (r.labels["paper method"], r.labels["#layers"]): r.paper.get("memory_gb")
        for r in get_experiment("table5").rows("paper")
    }
    lines = _paper_table(5)
    assert len(lines) == 8
    for method, _, _, layers, _, mem in lines:
        assert t5[(method, int(layers))] == (mem if mem == "OOM" else float(mem))
    ((_, _, _, layers, params, mem, thr),) = _paper_table(6)
    row = get_experiment("table6").rows("paper")[0]
    assert row.paper == {"memory_gb": float(mem), "throughput": float(thr)} and int(layers) == table6.LAYERS
    assert "17" in params and 17e9 <= table6.params_at(table6.HIDDEN) < 17.5e9


def test_bert_params_counts_a_built_model():
    cfg = ModelConfig(layers=3, hidden=24, heads=2, intermediate=40, vocab_size=101, max_seq=17).resolved()
    model = build_model(cfg, seed=0)
    assert l2l_common.bert_params(3, 24, 40, 101, 17) == sum(p.numel() for p in model.parameters())


def test_widest_fit_is_the_widest_that_fits():
    for host in (8 * 10**9, 25 * 10**9, 128 * 2**30, 512 * 10**9):
        h = table6.widest_hidden(host)
        budget = l2l_common.HOST_HEADROOM * host
        assert h % table6.HEAD_DIM == 0
        assert table6.host_need(h) <= budget < table6.host_need(h + table6.HEAD_DIM)
    assert table6.host_need(table6.HIDDEN) < 512 * 10**9  # the paper's 17B run fits its 512 GB host


def test_row_options_reach_the_cell_and_set_wins():
    exp = get_experiment("table5")
    cells = {c.row.name: c for c in exp.cells("tiny", only=["stash-cpu-x1", "stash-gpu-x1"])}
    assert cells["stash-cpu-x1"].run.options == {"stash": "cpu", "overlap": "on"}
    assert cells["stash-gpu-x1"].run.options["stash"] == "gpu"
    (cell,) = exp.cells("tiny", only=["stash-cpu-x1"], overrides=["overlap=off"])
    assert cell.run.options == {"stash": "cpu", "overlap": "off"}
    bad = l2l_common.l2l_row("bad", "l2l-cmp", {}, {}, options={"stash": "disk"})
    with pytest.raises(ConfigError, match="stash"):
        dataclasses.replace(exp, rows=lambda profile: [bad]).cells("tiny")


# make test-slow (20 s): L2L memory flat in depth stays in the default run (tests/l2l/test_l2l_memory.py)
@pytest.mark.slow
def test_table5_two_depths_end_to_end(tmp_path, monkeypatch):
    # One thread per cell process: on a small shared machine, OpenMP threads that spin for a busy
    # core make a step up to ~70x slower.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # The baseline and L2L with a host stash, at two depths (stash=gpu's slope is tests/l2l/test_l2l_memory.py's).
    only = [f"{v}-x{s}" for v in ("baseline", "stash-cpu") for s in (1, 2)]
    records = sweep(
        SweepRequest(
            table5.EXPERIMENT,
            profile="tiny",
            only=only,
            overrides=["warmup=0", "steps=1"],
            wandb_mode="off",
            results_dir=tmp_path,
        ),
        progress=lambda m: None,
    )
    got = {r["row"]: r for r in records}
    assert {r: got[r]["status"] for r in only} == {**{r: "ok" for r in only}, "baseline-x2": "oom"}
    mem = {r: got[r]["metrics"].get("memory_gb") for r in only}
    assert mem["stash-cpu-x2"] == mem["stash-cpu-x1"]  # flat in depth
    table = (tmp_path / "table5.md").read_text()
    assert "| baseline-x2 | amp | BASELINE |" in table and "| oom |" in table and "| OOM |" in table
    assert "9.23" in table and "not run" in table  # the paper's values, and the rows left out by `only`
    assert (tmp_path / "figures" / "table5_memory_vs_depth.png").stat().st_size > 10_000


@pytest.mark.parametrize("profile", ["tiny", "paper"])
def test_table2_runs_the_papers_relay_and_changes_one_setting_per_variant(profile):
    """Table 2's L2L rows take the paper's settings from the method's defaults (Algorithm 2, the stash on the device:
    a default changed would change them silently, so this holds them); each variant row differs from the row it is
    held against in exactly one of stash and overlap and in nothing else, and every row's labels say both."""
    from experiments.l2l_common import placed
    from experiments.table2 import PAPER_RELAY, VARIANTS

    exp = get_experiment("table2")
    cells = {c.row.name: c for c in exp.cells(profile)}
    for name in ("l2l-fp32", "l2l-cmp"):
        cls = registry.get(cells[name].run.method)
        assert {k: cells[name].run.options.get(k, cls.options[k].default) for k in PAPER_RELAY} == PAPER_RELAY
        assert {k: cells[name].row.labels[k] for k in PAPER_RELAY} == placed(PAPER_RELAY)  # the stash as `device`

    def settings(cell):
        defaults = registry.get(cell.run.method).options
        return {k: cell.run.options.get(k, defaults[k].default) for k in PAPER_RELAY}

    for name, _, _, options, against in VARIANTS:
        variant, other = cells[name], cells[against]
        assert dataclasses.replace(variant.run, options={}) == dataclasses.replace(other.run, options={})
        assert settings(variant) == options and {k: variant.row.labels[k] for k in options} == placed(options)
        assert sum(settings(variant)[k] != settings(other)[k] for k in PAPER_RELAY) == 1, (name, against)
    assert all(set(PAPER_RELAY) <= set(c.row.labels) for c in cells.values())
