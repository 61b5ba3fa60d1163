"""The committed results a program reads: every CSV one tidy table (each row as wide as its header), loaded with
`csv` strictly and with pandas where it is installed."""

import csv
import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSVS = subprocess.run(["git", "ls-files", "results/*.csv"], cwd=ROOT, capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("name", CSVS)
def test_every_committed_csv_is_one_tidy_table(name):
    with open(ROOT / name, newline="") as f:
        header, *rows = list(csv.reader(f, strict=True))
    assert len(set(header)) == len(header), f"{name}: a column named twice"
    ragged = [i + 2 for i, r in enumerate(rows) if len(r) != len(header)]
    assert not ragged, f"{name}: lines {ragged[:5]} are not {len(header)} fields wide"
    if importlib.util.find_spec("pandas") is not None:
        import pandas

        assert len(pandas.read_csv(ROOT / name)) == len(rows)
