"""`python -m suite campaign --next` (issue 51): the next loan unit at this code, in the order of what it settles:
stage 1 until its report on the target is done, then one table's complete section (stale records included), with
its estimate against one call's budget and its command."""

import json
import shutil

from suite.campaign import next_unit
from suite.config import paths


def test_the_next_unit_is_stage_1_until_done_then_a_tables_section_that_fits_one_call(tmp_path):
    for part in ("runs/h100-79gb", "campaign/h100-79gb", "campaign/precount"):
        shutil.copytree(paths.RESULTS_DIR / part, tmp_path / part)
    said = next_unit.next_unit("h100", tmp_path)
    assert "stage 1 not done at 1253528" in said and "python -m suite campaign --stage 1 --budget 540" in said
    report = tmp_path / "campaign" / "h100-79gb" / "stage-1.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "done": True}))
    said = next_unit.next_unit("h100", tmp_path)
    # Table 3's H100 rows were measured by older codes: stale, measured again with every row the section runs
    assert "table3's paper section (stage 2)" in said and " stale" in said, said
    assert ": fits one call" in said and "python -m suite run table3 --profile paper --worker --precount" in said
    estimate = float(said.split("estimated ")[1].split(" s")[0])
    assert 0 < estimate <= next_unit.LIMIT_S
    assert "about 3 calls" in next_unit._fits(2.5 * next_unit.LIMIT_S)
