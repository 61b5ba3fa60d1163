"""Figures a reader can use: one per question, a bar per machine that has the rows, partial rows hatched and said
so, the legend outside the data."""

import shutil

from suite.config import paths
from suite.core.experiment import get_experiment
from suite.report import plots, tables


def test_one_figure_per_ratio_partial_rows_hatched_and_the_legend_below_the_data(tmp_path, monkeypatch):
    shutil.copytree(paths.RESULTS_DIR / "runs", tmp_path / "runs")
    exp = get_experiment("table2")
    drawn = {}
    real = plots.save

    def keep(fig, results_dir, name, dpi=120):
        drawn[name] = fig
        ax = fig.axes[0]
        fig.canvas.draw()
        legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
        drawn[name + ":below"] = legend.y1 <= axes.y0  # under the axes, not over the bars
        drawn[name + ":labels"] = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn[name + ":hatched"] = any(p.get_hatch() for p in ax.patches)
        return real(fig, results_dir, name, dpi)

    monkeypatch.setattr(plots, "save", keep)
    paths_written = plots.ratio_figures(exp, tmp_path)
    names = ["table2_memory_gb.png", "table2_throughput.png"]
    assert sorted(p.name for p in paths_written) == sorted(names + [f"front_{n}" for n in names])
    assert drawn["table2_throughput:below"] and drawn["table2_memory_gb:below"]
    labels = drawn["table2_throughput:labels"]
    assert "h200-140gb · paper" in labels and "the paper" in labels  # the H200's partial rows are drawn
    # the H100's, whose reference is suspect, are not: the legend says why (suite/records/trust.py)
    assert "h100-79gb · paper" not in labels and any(x.startswith("not drawn: h100-79gb") for x in labels)
    assert drawn["table2_throughput:hatched"] and any(x.startswith("hatched: fewer timing rounds") for x in labels)
    # a machine whose section has no ratio of this metric draws no bar (the counted section has no throughput)
    assert not any(x.endswith("· counted") for x in labels)
    assert any(t.endswith("counted") for t in (plots.short(s[0]) for s in tables.sections(exp, tmp_path)))


def test_a_contended_sections_withheld_ratios_are_marked_not_drawn_and_coloured_alike_in_every_figure(
    tmp_path, monkeypatch
):
    """A machine that was busy while its rows were timed: the table shows no rate ratio, so the figure draws no bar
    for one either (it drew hollow ones, issue 53) but marks each as withheld and says so in its legend; its memory
    ratios, which the table shows, are drawn; each section has one colour in both figures alike."""
    import json

    shutil.copytree(paths.RESULTS_DIR / "runs", tmp_path / "runs")
    busy = {"contended": True, "reasons": ["load 3.0 on 2 cores"]}
    for path in (tmp_path / "runs" / "cpu-epyc-f25m1-avx2-2c").glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == "table2":
            rec["metrics"]["contention"] = busy
            path.write_text(json.dumps(rec))
    exp = get_experiment("table2")
    drawn = {}

    def keep(fig, results_dir, name, dpi=120):
        ax = fig.axes[0]
        drawn[name] = {
            "labels": [t.get_text() for t in ax.get_legend().get_texts()],
            "colours": {
                t.get_text(): h.get_facecolor()
                for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)
                if hasattr(h, "get_facecolor")  # (the paper's marker is a line)
            },
            "withheld": [t.get_text() for t in ax.texts if "withheld" in t.get_text()],
            "values": [t.get_text() for t in ax.texts if t.get_text().strip().endswith("x")],
        }
        return results_dir / f"{name}.png"

    monkeypatch.setattr(plots, "save", keep)
    plots.ratio_figures(exp, tmp_path)
    throughput, memory = drawn["table2_throughput"], drawn["table2_memory_gb"]
    section = "cpu-epyc-f25m1-avx2-2c · tiny"
    assert section in throughput["labels"] and throughput["withheld"]  # marked, not drawn
    assert any(x.startswith("withheld: contended") for x in throughput["labels"])
    assert memory["values"] and not memory["withheld"]  # memory ratios the table shows: drawn, with their values
    _, cells, records = next(s for s in tables.sections(exp, tmp_path) if "on cpu-epyc-f25m1-avx2-2c (" in s[0])
    cols, rows = tables.table_rows(exp, cells, records)
    assert all(r[cols.index("throughput xbaseline-fp32 ours")] is None for r in rows)  # the table shows none
    for label in set(throughput["colours"]) & set(memory["colours"]) - {"the paper"}:
        assert throughput["colours"][label] == memory["colours"][label], label


def test_the_front_page_draws_the_gpus_paper_sections_alone():
    """The README's figure (issues 51, 62): the paper profile on a GPU, the same whichever machine renders it; every
    CPU's runs, the rendering machine's too, stay on the table's page."""
    secs = tables.sections(get_experiment("table2"), paths.RESULTS_DIR, warn=lambda _: None, variants=False)
    got = [plots.short(t) for t, _, _ in plots.front_sections(secs)]
    assert "h200-140gb · paper" in got and "h100-79gb · paper" in got
    assert all(g.endswith("· paper") for g in got) and not any("cpu" in g for g in got)


def test_a_rate_of_fewer_than_3_rounds_is_drawn_hatched_memory_of_one_round_is_not():
    """A front-page bar resting on a one-round rate says so where it is drawn (issue 51); memory needs one round."""
    rate = {"metrics": {"throughput": 10.0}}
    one = {"status": "ok", "rounds": 1, **rate}
    assert plots.thin(one) and not plots.partial(one)
    assert plots.thin({"status": "partial: 1/3 rounds", "rounds": 1, **rate})
    assert not plots.thin({"status": "ok", "rounds": 3, **rate})
    assert plots.thin({"status": "ok", **rate})  # a record that says no rounds rests on one
    assert not plots.thin({"status": "ok", "rounds": 1, "metrics": {"memory_gb": 1.0}})  # memory needs one round


def test_a_busy_reference_withholds_every_rate_of_its_section_and_tiny_memory_says_what_it_cannot_test(
    tmp_path, monkeypatch
):
    """Only the reference timed on a busy machine: the table shows no rate ratio in its section, so the figure marks
    every row's as withheld (the peers' solid bars against a contended baseline, issue 53). Memory: sections whose
    ratios are the same draw one bar naming each, and a toy profile's bars come with the words that they do not test
    the paper's ratio."""
    import json

    shutil.copytree(paths.RESULTS_DIR / "runs", tmp_path / "runs")
    for path in (tmp_path / "runs" / "cpu-epyc-f25m1-avx2-2c").glob("*.json"):
        rec = json.loads(path.read_text())
        if rec["experiment"] == "table2" and rec["row"] == "baseline-fp32":
            rec["metrics"]["contention"] = {"contended": True, "reasons": ["load 3.0 on 2 cores"]}
            path.write_text(json.dumps(rec))
    drawn = {}

    def keep(fig, results_dir, name, dpi=120):
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn[name] = (labels, [t for t in ax.texts if "withheld" in t.get_text()])
        return results_dir / f"{name}.png"

    monkeypatch.setattr(plots, "save", keep)
    plots.ratio_figures(get_experiment("table2"), tmp_path)
    labels, withheld = drawn["table2_throughput"]
    assert len(withheld) >= 3 and any("or its reference" in x for x in labels)
    labels, _ = drawn["table2_memory_gb"]
    merged = [x for x in labels if x.count("· tiny") > 1]  # machines whose memory ratios are the same: one bar
    assert merged and all(x.count(", ") >= 1 for x in merged)
    assert any(x.startswith("tiny profile: a toy shape") for x in labels)
    assert not any("fewer timing rounds" in x for x in labels)  # memory is hatched for a partial record only
