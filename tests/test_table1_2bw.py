"""The 2bw-table1 experiment expands to its four pre-training cells."""

import pytest

from suite.core.experiment import get_experiment


def test_tiny_expands_to_four_pipeline_cells(monkeypatch):
    monkeypatch.delenv("SUITE_GLUE_DIR", raising=False)
    cells = get_experiment("2bw-table1").cells("tiny")
    assert [(c.row.name, c.run.method, c.run.model.family) for c in cells] == [
        ("bert-vanilla", "pipedream-flush", "bert-mlm"),
        ("bert-2bw", "pipedream-2bw", "bert-mlm"),
        ("gpt2-vanilla", "pipedream-flush", "gpt2"),
        ("gpt2-2bw", "pipedream-2bw", "gpt2"),
    ]
    for c in cells:
        assert c.kind == "pretrain" and c.run.device == "cpu"
        assert c.run.options["executor"] == "dist" and c.run.options["stages"] == 2
        assert c.run.options["data_dir"] == "tests/fixtures/glue" and c.run.options["finetune_task"] == "rte"
    assert len({c.key for c in cells}) == 4
    assert cells[0].row.paper == {"ft_score": 87.77, "ft_score_90": "N/A"}


def test_paper_rows_skip_without_data(monkeypatch):
    monkeypatch.delenv("SUITE_GLUE_DIR", raising=False)
    exp = get_experiment("2bw-table1")
    assert all(r.skip and "GLUE" in r.skip for r in exp.rows("paper"))
    assert exp.cells("paper") == []


@pytest.mark.parametrize("profile", ["small", "paper"])
def test_larger_profiles_validate(monkeypatch, tmp_path, profile):
    monkeypatch.setenv("SUITE_GLUE_DIR", str(tmp_path))
    cells = get_experiment("2bw-table1").cells(profile)
    assert len(cells) == 4 and all(c.run.model.layers >= 12 for c in cells)
