"""`python -m suite campaign --next` (issue 51): the next loan unit at this code, in the order of what it settles:
stage 1 until its report on the target is done, then one table's complete section (stale records included), with
its estimate against one call's budget and its command."""

import json
import shutil

import pytest

from suite.commands.campaign import next_unit
from suite.commands.campaign.estimate import Line
from suite.config import paths


def _results(tmp_path):
    for part in ("runs/h100-79gb", "campaign/h100-79gb", "campaign/precount"):
        shutil.copytree(paths.RESULTS_DIR / part, tmp_path / part)
    return tmp_path / "campaign" / "h100-79gb" / "stage-1.json"


def test_stage_1_comes_first_until_its_report_on_the_target_is_done(tmp_path, monkeypatch):
    _results(tmp_path)  # the H100's stage 1 was cut at its deadline (1253528): not done
    lines = [Line(1, "cuda tests", 1, 300.0, "x"), Line(2, "table3/l2l-cmp-u1", 3, 90.0, "x", decision="stale")]
    monkeypatch.setattr(next_unit, "estimate", lambda *a, **k: lines)
    said = next_unit.next_unit("h100", tmp_path)
    assert "stage 1 not done at 1253528" in said and "estimated 300 s of the 540 s a call has: fits one call" in said
    assert "python -m suite campaign --stage 1 --budget 540" in said
    assert "about 3 calls" in next_unit._fits(2.5 * next_unit.LIMIT_S)


@pytest.mark.slow  # 8 s: the campaign's whole estimate; the unit's choice and its line run in make test above
def test_then_a_tables_section_with_its_stale_rows_that_fits_one_call(tmp_path):
    report = _results(tmp_path)
    report.write_text(json.dumps({**json.loads(report.read_text()), "done": True}))
    said = next_unit.next_unit("h100", tmp_path)  # the campaign's own estimate, from the committed records
    # Table 3's H100 rows were measured by older codes: stale, measured again with every row the section runs
    assert "table3's paper section (stage 2)" in said and " stale" in said, said
    assert ": fits one call" in said and "python -m suite run table3 --profile paper --worker --precount" in said
    assert 0 < float(said.split("estimated ")[1].split(" s")[0]) <= next_unit.LIMIT_S
