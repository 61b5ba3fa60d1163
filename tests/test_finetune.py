"""Fine-tuning: the loop learns, the best checkpoint, eval-mode scoring of the method's weights, data errors."""

import dataclasses
import os
import random

import pytest
import torch

from suite.config.errors import ConfigError
from suite.config.run import ModelConfig, RunConfig
from suite.core import registry
from suite.core.check import build_method
from suite.harness.model import plain_copy
from suite.tasks.finetune import BestCheckpoint, Evaluator, FinetuneOptions, finetune, prepare, trim
from suite.tasks.glue import GlueDataError, batches

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "glue")
TINY = ModelConfig(preset="tiny", layers=1, hidden=32, heads=2, intermediate=64)
QUIET = lambda msg: None  # noqa: E731


def tiny_run(task: str, data_dir: str, method: str = "grad_accum", **options) -> RunConfig:
    opts = {"task": task, "data_dir": data_dir, "epochs": 1, "evals_per_epoch": 2, **options}
    return RunConfig(
        method=method,
        model=TINY,
        seq_len=48,
        micro_batch_size=4,
        num_micro_batches=2,
        schedule="linear",
        options=opts,
        device="cpu",
    )


def write_separable(folder, n_train=64, n_dev=32):
    """SST-2-shaped files whose label is whether the sentence says 'good' or 'bad'."""
    rnd = random.Random(0)
    filler = "the movie film plot story actors ending music was really quite very a an it".split()
    os.makedirs(folder / "SST-2")
    for split, n in (("train", n_train), ("dev", n_dev)):
        lines = ["sentence\tlabel"]
        for i in range(n):
            words = rnd.choices(filler, k=rnd.randint(3, 8))
            words.insert(rnd.randint(0, len(words)), "good" if i % 2 else "bad")
            lines.append(f"{' '.join(words)}\t{i % 2}")
        (folder / "SST-2" / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def test_the_loop_learns_a_separable_task_and_keeps_its_best_weights(tmp_path):
    pytest.importorskip("datasets")
    write_separable(tmp_path)
    run = dataclasses.replace(tiny_run("sst2", str(tmp_path), epochs=6), optimizer="adamw", lr=3e-3)
    res = finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), checkpoint_dir=tmp_path / "ckpt", log=QUIET)
    scores = [p["accuracy"] for p in res.curve]
    assert scores[0] < 75 and res.score >= 90, scores
    assert res.run.total_steps == 6 * 8 and res.run.warmup_steps == 5  # 10% of 48 steps, rounded
    assert [p["step"] for p in res.curve] == [0, *range(4, 48, 4), 48]
    assert res.best_score == max(scores) and res.best_step == res.curve[scores.index(max(scores))]["step"]
    # the saved best weights score exactly the recorded best
    data = prepare(run, FinetuneOptions.from_run(run))
    evaluator = Evaluator(res.run, "sst2", data.dev, torch.device("cpu"))
    assert 100 * evaluator(res.best.load())["accuracy"] == res.best_score
    assert (tmp_path / "ckpt" / "best.pt").exists()


def test_best_checkpoint_keeps_the_first_best_and_ignores_nan(tmp_path):
    states = {s: {"w": torch.full((2,), float(s))} for s in range(5)}
    for best in (BestCheckpoint(), BestCheckpoint(tmp_path / "best.pt")):
        offered = [
            best.offer(score, step, states[step]) for step, score in enumerate([50.0, 70.0, 70.0, 60.0, float("nan")])
        ]
        assert offered == [True, True, False, False, False]
        assert (best.score, best.step) == (70.0, 1)
        assert torch.equal(best.load()["w"], states[1]["w"])
    states[1]["w"].add_(1)  # the in-memory copy is a copy
    assert BestCheckpoint().load() is None


def test_evaluation_scores_the_methods_current_weights_in_eval_mode():
    pytest.importorskip("datasets")
    run = dataclasses.replace(
        tiny_run("rte", FIXTURES), model=dataclasses.replace(TINY, dropout=0.5, attention_dropout=0.5)
    )
    data = prepare(run, FinetuneOptions.from_run(run))
    method = build_method(data.run, torch.device("cpu"))
    batch = next(batches(data.train, 8, 0))
    method.step(trim(batch))
    evaluator = Evaluator(data.run, "rte", data.dev, torch.device("cpu"))
    first = evaluator.predict(method.state_dict())
    assert evaluator.predict(method.state_dict()) == first  # no dropout: the same predictions twice
    assert method.model.training  # the method's own model is left training
    # the same weights through the stock Hugging Face model in eval mode predict the same
    plain = plain_copy(method.model).eval()
    expected = []
    with torch.no_grad():
        for b in evaluator.batches:
            out = plain(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids)
            expected += out.logits.argmax(-1).tolist()
    assert first == expected
    with pytest.raises(ValueError, match="missing"):
        evaluator.load({k: v for k, v in method.state_dict().items() if "classifier" not in k})


def test_random_init_vocabulary_matches_the_trained_tokenizer():
    pytest.importorskip("datasets")
    run = tiny_run("mrpc", FIXTURES)
    data = prepare(run, FinetuneOptions.from_run(run))
    assert data.run.model.vocab_size == len(data.tokenizer)
    assert data.run.model.pretrained is None


def _copy_task(dst, folder):
    os.makedirs(dst / folder)
    for split in ("train", "dev"):
        src = os.path.join(FIXTURES, folder, f"{split}.tsv")
        (dst / folder / f"{split}.tsv").write_bytes(open(src, "rb").read())


def test_a_malformed_tsv_names_the_file_and_the_expected_columns(tmp_path):
    _copy_task(tmp_path, "RTE")
    bad = tmp_path / "RTE" / "train.tsv"
    bad.write_text("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    run = tiny_run("rte", str(tmp_path))
    with pytest.raises(GlueDataError) as err:
        finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), log=QUIET)
    assert str(bad) in str(err.value) and "sentence1, sentence2, label" in str(err.value)
    _copy_task(tmp_path, "CoLA")
    (tmp_path / "CoLA" / "train.tsv").write_text("gj04\t1\tThe sentence lost a field.\n")
    run = tiny_run("cola", str(tmp_path))
    with pytest.raises(GlueDataError, match=r"CoLA/train.tsv.*line 1 has 3 fields.*source, label, original-label"):
        finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), log=QUIET)


def test_a_missing_tsv_names_the_file_and_the_expected_columns(tmp_path):
    _copy_task(tmp_path, "MRPC")
    os.remove(tmp_path / "MRPC" / "train.tsv")
    run = tiny_run("mrpc", str(tmp_path))
    with pytest.raises(GlueDataError) as err:
        finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), log=QUIET)
    msg = str(err.value)
    assert str(tmp_path / "MRPC" / "train.tsv") in msg and "#1 String, #2 String, Quality" in msg


def test_options_and_labels_are_checked():
    with pytest.raises(ConfigError, match="unknown fine-tuning option.*'epoch'"):
        FinetuneOptions.from_run(tiny_run("rte", FIXTURES, epoch=3))
    with pytest.raises(GlueDataError, match="accepted tasks"):
        FinetuneOptions.from_run(tiny_run("mnli", FIXTURES))
    run = tiny_run("stsb", FIXTURES)  # regression needs one output
    with pytest.raises(ConfigError, match="model.num_labels=1"):
        prepare(run, FinetuneOptions.from_run(run))


@pytest.mark.skipif(not registry.is_registered("l2l"), reason="the l2l method is not registered")
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_fp32_l2l_fine_tunes_to_the_baselines_weights(pooling):
    """The paper's claim, at test scale: same seed, same batches, keyed dropout -> equal up to rounding."""
    pytest.importorskip("datasets")
    ends = []
    for method, mb, n in (("grad_accum", 2, 4), ("l2l", 8, 1)):
        run = dataclasses.replace(tiny_run("rte", FIXTURES, method), micro_batch_size=mb, num_micro_batches=n)
        run = dataclasses.replace(run, model=dataclasses.replace(run.model, pooling=pooling))
        res = finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), log=QUIET)
        ends.append(res)
    a, b = (r.final_state for r in ends)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert [p["accuracy"] for p in ends[0].curve] == [p["accuracy"] for p in ends[1].curve]


def test_history_logs_loss_rate_and_throughput_and_the_loss_falls(tmp_path):
    """Every log_every steps a history point: the mean loss since the last, the rate the schedule gave, samples/s."""
    pytest.importorskip("datasets")
    write_separable(tmp_path)
    run = dataclasses.replace(tiny_run("sst2", str(tmp_path), epochs=6, log_every=4), optimizer="adamw", lr=3e-3)
    res = finetune(run, FinetuneOptions.from_run(run), torch.device("cpu"), checkpoint_dir=tmp_path / "c", log=QUIET)
    steps = [h["step"] for h in res.history]
    assert steps == list(range(4, 49, 4))
    assert res.history[-1]["loss"] < 0.8 * res.history[0]["loss"]  # it learns: the loss falls by a fifth or more
    from suite.harness.optim import lr_at

    assert [h["lr"] for h in res.history] == [lr_at(res.run, s - 1) for s in steps]
    assert all(h["samples_per_s"] > 0 for h in res.history)


def _split_run(tmp_path, write=True, **options):
    if write:
        write_separable(tmp_path, n_train=40, n_dev=20)
    run = tiny_run("sst2", str(tmp_path), **options)
    return prepare(run, FinetuneOptions.from_run(run))


def test_a_dev_split_trains_on_part_of_dev_and_scores_the_rest(tmp_path):
    """A task without its train file (QNLI here): the first N of a fixed permutation of dev train, the rest is
    scored, the same samples whatever the run's seed."""
    pytest.importorskip("datasets")
    data = _split_run(tmp_path, split="dev:15")
    assert (len(data.train), len(data.dev)) == (15, 5)
    assert data.described["train"] == "15 of dev" and data.described["scored"] == "the other 5 of dev"
    ids = lambda ds: {tuple(x) for x in ds["input_ids"]}  # noqa: E731
    assert not ids(data.train) & ids(data.dev)
    other = prepare(dataclasses.replace(data.run, seed=7), FinetuneOptions.from_run(data.run))
    assert ids(other.dev) == ids(data.dev)


def test_a_holdout_scores_a_fifth_of_train_and_never_reads_dev(tmp_path):
    pytest.importorskip("datasets")
    write_separable(tmp_path, n_train=40, n_dev=20)
    (tmp_path / "SST-2" / "dev.tsv").write_text("garbage without a header\n")  # a holdout never reads dev
    data = _split_run(tmp_path, write=False, split="holdout:0.2", train_samples=20)
    assert (len(data.train), len(data.dev)) == (20, 8)  # 8 of 40 held out, then 20 of the other 32
    assert data.described["scored"] == "the other 8 of train (dev unseen)"
    assert data.described["train"] == "20 of 32 of train" and data.described["drawn_by"] == "permutation seeded 0"


@pytest.mark.parametrize("split", ["dev", "dev:0", "holdout:1.5", "test", "train:3"])
def test_a_wrong_split_is_one_line_naming_what_is_accepted(split):
    with pytest.raises(ConfigError, match="accepted are 'train'"):
        FinetuneOptions.from_run(tiny_run("sst2", FIXTURES, split=split))
