"""A run touches only its own machine's results: a data folder an experiment cannot read fails in one line before
anything runs, and no run's data folder changes how another machine's section reads."""

import hashlib
import shutil

from suite.commands import cli
from suite.config import paths
from suite.core.experiment import get_experiment
from suite.report import tables


def _digests(folder):
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_without_glue_data_fails_in_one_line_and_writes_nothing(tmp_path, capsys):
    before = _digests(paths.RESULTS_DIR)
    (tmp_path / "notes").mkdir()  # a folder, but no task's TSVs
    assert cli.main(["run", "table7", "--profile", "tiny", "--data-dir", str(tmp_path), "--wandb", "off"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GLUE task's train.tsv or dev.tsv in it" in err[0] and "MRPC" in err[0]
    assert cli.main(["run", "table2", "--profile", "tiny", "--data-dir", str(tmp_path)]) == 2
    assert "table2 reads no data folder; the experiments that do: 2bw-table1, table7" in capsys.readouterr().err
    assert _digests(paths.RESULTS_DIR) == before


def test_a_runs_data_folder_leaves_every_section_as_its_records_say(tmp_path, monkeypatch):
    """Table 7 rendered from its committed records reads the same with an empty folder as the run's data folder
    (before, every machine's rows not run read `skipped: dev-only data`), and as committed."""
    exp = get_experiment("table7")
    shutil.copytree(paths.RESULTS_DIR / "runs", tmp_path / "runs")
    monkeypatch.delenv(paths.GLUE_DIR_ENV, raising=False)
    plain = tables.write_tables(exp, tmp_path)[0].read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(paths.GLUE_DIR_ENV, str(empty))
    assert tables.write_tables(exp, tmp_path)[0].read_text() == plain
    # a clone whose `small` data folder is not there (a folder named but absent)
    import experiments.table7 as table7

    monkeypatch.delenv(paths.GLUE_DIR_ENV)
    real = table7.data_dir
    monkeypatch.setattr(table7, "data_dir", lambda p: str(tmp_path / "absent") if p == "small" else real(p))
    assert tables.write_tables(exp, tmp_path)[0].read_text() == plain
    assert plain == (paths.RESULTS_DIR / "table7.md").read_text()
