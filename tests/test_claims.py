"""The README's claims at a glance: generated from the committed records, and judged by rules fixed in code."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from experiments.claims import l2l
from suite.config.run import RunConfig
from suite.core.experiment import get_experiment
from suite.report import claims, verdicts
from suite.report.reading import Where, read

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_block_is_what_the_records_give(tmp_path):
    """The committed block equals the renderer's output from the committed records (those git holds: a user's own
    runs since do not count): it cannot drift. After new records, `python -m suite render` rewrites it."""
    tracked = subprocess.run(["git", "ls-files", "results/runs"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0 or not tracked.stdout.strip():
        pytest.skip("not a git checkout: the committed records cannot be told from a user's own")
    for name in tracked.stdout.split():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, tmp_path / name)
    readme = (ROOT / "README.md").read_text()
    assert claims.committed_block(readme) == claims.block(tmp_path / "results"), "run `python -m suite render`"


def test_every_claim_names_its_machine_and_links_its_table():
    table = claims.render(claims.load_claims(), ROOT / "results")
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[3].startswith("`") and ("measured" in cells[3] or "counted" in cells[3]), line
        assert cells[5].startswith("[") and "(results/" in cells[5], line
        assert (ROOT / cells[5].split("(")[1].rstrip(")")).exists(), line


def test_replace_block_keeps_the_rest_of_the_readme():
    text = f"# Title\n\nbefore\n\n{claims.BEGIN}\nold table\n{claims.END}\n\nafter\n"
    new = claims.replace_block(text, f"{claims.BEGIN}\nnew table\n{claims.END}")
    assert new == f"# Title\n\nbefore\n\n{claims.BEGIN}\nnew table\n{claims.END}\n\nafter\n"
    with pytest.raises(ValueError):
        claims.replace_block("no markers", "x")


def test_write_readme_needs_the_markers(tmp_path):
    (tmp_path / "results").mkdir()
    assert claims.write_readme(tmp_path / "results") is None  # no README beside the results: nothing written
    (tmp_path / "README.md").write_text("# no markers\n")
    assert claims.write_readme(tmp_path / "results") is None
    assert (tmp_path / "README.md").read_text() == "# no markers\n"


def _fake(results: Path, machine: str, row: str, status: str, gb: float | None, sweep: str = "s1") -> None:
    """One table5 record at `paper` on `machine`, as the store keeps it (suite/records/schema.py)."""
    exp = get_experiment("table5")
    method = next(r.method for r in exp.rows("paper") if r.name == row)
    rec = {
        "experiment": "table5",
        "row": row,
        "profile": "paper",
        "machine": {"slug": machine},
        "device_type": "cuda",
        "status": status,
        "sweep": sweep,
        "finished": "2026-01-01T00:00:00+00:00",
        "key": row,
        "config": {"run": RunConfig(method=method).to_dict()},
        "metrics": {} if gb is None else {"memory_gb": gb},
        "method": method,
        "variant": "",
        "error": None,
        "provenance": None,
    }
    path = results / "runs" / machine / f"{row}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def test_the_table5_rules_on_fake_records(tmp_path):
    """Flat in depth within 2%, with the depths not run named; the baseline's out-of-memory case by status and size."""
    for d, gb in zip(l2l.DEPTHS, (4.00, 4.05, 4.07)):
        _fake(tmp_path, "fake-gpu", f"stash-cpu-{d}", "ok", gb)
    _fake(tmp_path, "fake-gpu", "baseline-x1", "ok", 7.0)
    _fake(tmp_path, "fake-gpu", "baseline-x2", "oom", None)
    _fake(tmp_path, "fake-gpu", "fp32-baseline-x2", "ok", 16.5)  # over 16 GB, under 16 GiB (17.18 GB)
    r = read(Where("table5", "paper", "fake-gpu"), tmp_path)
    flat = l2l.flat_in_depth(".2f")(r)
    assert flat.verdict == "reproduced to 96 layers"
    assert flat.ours == "4.00, 4.05, 4.07 GB at 24, 48, 96 layers; 384 layers: `not run`"
    assert l2l.out_at_48("baseline")(r).verdict == "reproduced"
    assert l2l.out_at_48("fp32-baseline")(r).verdict == "undecided (over 16 GB, under 16 GiB)"
    _fake(tmp_path, "fake-gpu", "stash-cpu-x16", "ok", 4.20)  # 5% above the shallowest
    assert l2l.flat_in_depth(".2f")(read(Where("table5", "paper", "fake-gpu"), tmp_path)).verdict.startswith(
        "not reproduced (5%"
    )
    assert read(Where("table5", "paper", "other-gpu"), tmp_path) is None  # no section: the claim says `not run`


def test_a_ratio_is_never_taken_across_sweeps(tmp_path):
    _fake(tmp_path, "fake-gpu", "stash-cpu-x1", "ok", 4.0, sweep="a")
    _fake(tmp_path, "fake-gpu", "stash-cpu-x2", "ok", 4.0, sweep="b")
    r = read(Where("table5", "paper", "fake-gpu"), tmp_path)
    assert r.ratio("stash-cpu-x2", "stash-cpu-x1", l2l.MEMORY) is None
    assert r.ratio("stash-cpu-x1", "stash-cpu-x1", l2l.MEMORY) == 1.0


def test_the_rules():
    depths = ["24", "48", "96", "384"]
    assert verdicts.flat([4.0, 4.0, 4.0, None], depths) == "reproduced to 96"
    assert verdicts.flat([4.0, None, 4.0, 4.0], depths) == "reproduced at 24, 96, 384 (not measured at the others)"
    assert verdicts.flat([4.0, 4.5, None, None], depths).startswith("not reproduced (12%")
    assert verdicts.out_of_memory("ok", 14.42) == "not reproduced"
    assert verdicts.out_of_memory("ok", 17.5) == "reproduced"  # over 16 GiB
    assert verdicts.gain([1.52, 1.95], [1.35, 1.62]) == "reproduced"
    assert verdicts.gain([1.04, 1.04], [1.35, 1.62]) == "smaller gain"
    assert verdicts.gain([0.99, 0.95], [1.35, 1.62]) == "not reproduced"
    assert verdicts.gain([1.5, None], [1.35, 1.62]) == "pending"
    assert verdicts.target([0.55, 0.80, 1.00], ["1", "2", "4"], 0.95) == "target met at 4 only"
    assert verdicts.target([0.96, 0.97], ["1", "2"], 0.95) == "target met"
    assert verdicts.order({"GPipe": 3, "2BW": 2, "Flush": 1}, ["GPipe", "2BW", "Flush"]) == "reproduced"
    assert verdicts.order({"GPipe": 2, "2BW": 3, "Flush": 1}, ["GPipe", "2BW", "Flush"]) == (
        "not reproduced (ours: 2BW > GPipe > Flush)"
    )
    assert verdicts.grows([0.62, 1.23, 38.7], 30.0) == "reproduced in shape, not in size"
    assert verdicts.grows([0.62, 1.23, 31.0], 30.0) == "reproduced"
    assert verdicts.grows([0.62, 0.6, 31.0], 30.0) == "not reproduced"
    assert verdicts.within_factor([0.284, -0.4], 2.0) and not verdicts.within_factor([1.2], 2.0)
