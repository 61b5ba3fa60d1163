"""Command line: listing, and clear errors for bad experiments, profiles, rows and --set keys."""

import os
import re
import subprocess
import sys

import pytest

from suite.commands.cli import main
from suite.config.errors import ConfigError
from suite.config.run import RunConfig, apply_overrides
from suite.config.sizes import parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_list_shows_methods_experiments_profiles(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("grad_accum", "amp", "table2", "tiny", "paper", "auto"):
        assert word in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "tabel2"], ["unknown experiment", "did you mean table2"]),
        (["run", "table2", "--profile", "huge"], ["unknown profile", "tiny, small, paper, auto"]),
        (["run", "table2", "--profile", "tinny"], ["unknown profile", "did you mean tiny"]),
        (["run", "table2", "--only", "baseline-fp33"], ["no row", "baseline-fp32"]),
        (["run", "table2", "--set", "micro_batch=3"], ["unknown --set key", "micro_batch_size"]),
        (["run", "table2", "--set", "steps=many"], ["steps", "int"]),
        (["run", "table2", "--set", "precision=fp8"], ["precision", "fp32"]),
        (["run", "table2", "--set", "precision=fp61"], ["did you mean fp16"]),
        (["run", "table2", "--set", "stash=cpux"], ["not one of", "did you mean cpu"]),
        (["run", "table2", "--only", "l2l-fp32", "--set", "method=amx"], ["unknown method", "did you mean amp"]),
        (["render", "tabel2"], ["unknown experiment", "did you mean table2"]),
        (["check", "grad_acum"], ["unknown method", "did you mean grad_accum"]),
        (["check", "amp", "--set", "precision=fp32"], ["precision", "fp16"]),
    ],
)
def test_bad_input_gets_a_clear_error(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err


def test_overrides_are_typed():
    cfg = apply_overrides(RunConfig(), ["model.layers=8", "lr=0.5", "device_memory=16GiB", "model.pretrained=none"])
    assert cfg.model.layers == 8 and cfg.lr == 0.5 and cfg.device_memory == "16GiB" and cfg.model.pretrained is None


def test_sizes():
    assert parse_size("16GiB") == 16 * 2**30 and parse_size("1.5GB") == 1_500_000_000 and parse_size("512") == 512
    with pytest.raises(ConfigError, match="GiB"):
        parse_size("lots")


@pytest.mark.slow  # make test-slow: about 10 s; suite check runs end to end in the Llama and L2L tests
def test_check_command_end_to_end():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "suite",
            "check",
            "grad_accum",
            "--steps",
            "2",
            "--set",
            "num_micro_batches=4",
            "--set",
            "micro_batch_size=1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS" in out.stdout and "bert.embeddings.word_embeddings.weight" in out.stdout


def test_render_writes_tables_from_records_alone(tmp_path, monkeypatch, capsys):
    """`render` reads the records and writes the table: nothing runs, and no record means rows 'not run'."""
    from suite.config import paths

    monkeypatch.setattr(paths, "RESULTS_DIR", tmp_path)
    assert main(["render", "table4"]) == 0
    assert (tmp_path / "table4.md").exists() and (tmp_path / "table4.csv").exists()
    assert not (tmp_path / "runs").exists()  # no cell ran, so no record was written
    assert "wrote" in capsys.readouterr().out


def test_a_method_option_set_on_a_table_goes_to_the_rows_whose_method_takes_it():
    from suite.core.experiment import get_experiment

    cells = get_experiment("table2").cells("tiny", None, ["stash=cpu"], None)
    stash = {c.row.name: c.run.options.get("stash") for c in cells}
    assert stash["l2l-fp32"] == "cpu" and stash["l2l-cmp"] == "cpu" and stash["baseline-fp32"] is None
    only = get_experiment("table2").cells("tiny", ["l2l-fp32"], ["stash=cpu"], None)  # the same with --only
    assert only[0].run.options["stash"] == "cpu"
    with pytest.raises(ConfigError, match="the rows selected take: .*stash"):
        get_experiment("table2").cells("tiny", None, ["stsh=cpu"], None)


def test_a_subcommand_names_its_own_unknown_arguments_and_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--workers", "8", "--batch", "64", "--profile", "tiny"])
    err = capsys.readouterr().err
    assert (
        "python -m suite plan: error: unrecognized arguments: --profile tiny" in err
        and "usage: python -m suite plan" in err
    )
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "campaign" in capsys.readouterr().out.split("positional arguments")[0]


def test_an_option_is_taken_by_its_whole_name_only(capsys):
    """argparse's prefix matching took `--profil tiny` for `--profile` (issue 65): refused, with the nearest option."""
    with pytest.raises(SystemExit):
        main(["run", "table2", "--profil", "tiny"])
    err = capsys.readouterr().err
    assert "python -m suite run: error: unrecognized arguments: --profil (did you mean --profile?) tiny" in err
    with pytest.raises(SystemExit):
        main(["campaign", "--stag", "1"])
    assert "--stag (did you mean --stage?)" in capsys.readouterr().err


def test_a_method_without_a_docstring_says_so_in_the_list(monkeypatch, capsys):
    from suite.core import registry

    class Undocumented(registry.get("grad_accum")):
        pass

    names = registry.names()
    monkeypatch.setattr(registry, "names", lambda: [*names, "undocumented"])
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda n: Undocumented if n == "undocumented" else real(n))
    assert main(["list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("undocumented"))
    assert "(no description: Undocumented has no docstring" in line


def test_the_campaign_help_lists_every_stage_from_its_table():
    import subprocess
    import sys

    from suite.commands.campaign.stages import STAGES

    out = subprocess.run(
        [sys.executable, "-m", "suite", "campaign", "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(out.split())
    for n, stage in STAGES.items():
        assert f"{n}: {' '.join(stage.title.split())}" in flat, n


def test_the_parser_and_its_help_import_no_torch():
    """`suite --help` took 2.5-4.7 s: the parser pulled torch in through the sweep request's choices."""
    import subprocess
    import sys

    probe = "import sys; from suite.commands.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "False", done.stderr


def test_check_lists_the_tensors_past_the_bound_and_every_one_only_when_asked():
    """`check` printed about 100 per-tensor lines with unlabelled columns on every run."""
    from suite.core.check import CheckResult

    errors = {"a.weight": 0.1, "b.bias": 0.7, "k.bias": 3.0}
    weights = dict.fromkeys(errors, 0.01)
    passed = CheckResult("m", "ref", 1, 0.5, {"a.weight": 0.1}, {"a.weight": 0.01}, set(), [(1.0, 1.0)])
    body = "\n".join(passed.report().splitlines()[:-1])  # the verdict line names the worst tensor
    assert "a.weight" not in body and "1 tensors within the bound" in body
    failed = CheckResult("m", "ref", 1, 0.5, errors, weights, {"k.bias"}, [(1.0, 1.0)])
    shown = "\n".join(failed.report().splitlines()[:-1])
    assert "update err  weight err  tensor" in shown and "b.bias" in shown
    assert "a.weight" not in shown and "k.bias" not in shown  # within the bound; not gated
    assert all(name in failed.report(verbose=True) for name in errors)


def test_the_list_is_kept_by_the_code_it_was_made_from_and_read_without_torch(tmp_path):
    """`suite list` makes its list once (every method and experiment imported: seconds) and keeps it under the results
    folder keyed by the tree's sources; the next process reads it without importing torch. Options read one way."""
    from suite.commands import listing

    env = {**os.environ, "SUITE_RESULTS_DIR": str(tmp_path)}
    env.pop("SUITE_PLUGINS", None)
    first = subprocess.run([sys.executable, "-m", "suite", "list"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    kept = list((tmp_path / ".cache" / "list").glob("*.txt"))
    assert len(kept) == 1 and kept[0].read_text() == first.stdout == listing.make()
    probe = "import sys; from suite.commands.cli import main; main(['list']); print('torch' in sys.modules)"
    second = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.stdout == first.stdout + "False\n", second.stderr
    options = [x.split("options: ")[1] for x in first.stdout.splitlines() if "options: " in x]
    pattern = re.compile(r"^[a-z_]+=[\w.]+( \([\w.]+(\|[\w.]+)+\))?$")
    assert options and all(pattern.match(o) for line in options for o in line.split(", ")), options
    assert "recompute=on (off|on)" in first.stdout and "recompute=True" not in first.stdout  # a switch as one word
    columns = {len(x) - len(x.lstrip()) for x in first.stdout.splitlines() if "options: " in x}
    assert len(columns) == 1  # every options line starts where the descriptions do


def test_the_kept_list_follows_the_code(tmp_path, monkeypatch):
    from suite.commands import listing

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(listing.paths, "ROOT", str(tmp_path))
    before = listing.digest()
    (tmp_path / "suite" / "a.py").write_text("x = 2\n")
    assert listing.digest() != before
    monkeypatch.setenv("SUITE_PLUGINS", "my_methods")  # code outside the tree: made each time, never kept
    assert listing.digest() is None


def test_the_decoders_run_at_paper_unless_a_profile_is_named():
    """`make decoder` and `make decoder-8b` hard-coded `--profile paper`: no Llama row ran on a CPU from make."""
    import subprocess

    from suite.config import paths

    def dry(*args):
        out = subprocess.run(["make", "-n", *args], cwd=paths.ROOT, capture_output=True, text=True, check=True)
        return [ln for ln in out.stdout.splitlines() if " -m suite run " in ln]

    assert all("--profile paper" in ln for ln in dry("decoder", "decoder-8b")), dry("decoder", "decoder-8b")
    tiny = dry("decoder-8b", "PROFILE=tiny", "DECODER_MEASURE=time")
    assert tiny[0].rstrip().endswith("run decoder-8b --profile tiny --measure time") and "--profile tiny" in tiny[1]
