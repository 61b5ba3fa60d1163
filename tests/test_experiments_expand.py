"""Every experiment expands into validated cells at every profile (a table must never fail before it runs)."""

import pytest

from suite.core.cell import check_cells
from suite.core.experiment import all_experiments


@pytest.mark.slow  # the paper profile of 2bw-fig9 profiles BERT-base layers on the CPU first
@pytest.mark.parametrize("profile", ["tiny", "small", "paper"])
def test_every_experiment_expands(profile, tmp_path, monkeypatch):
    monkeypatch.setattr("suite.config.paths.RESULTS_DIR", tmp_path)  # profile caches land in the temp folder
    for name, exp in sorted(all_experiments().items()):
        cells = exp.cells(profile)
        assert all(c.key for c in cells), name
        assert len({c.key for c in cells}) == len(cells), f"{name}: two rows resolve to one cell"
        check_cells(cells)  # every method's constraints (ranks, widths, stages) hold before launch
