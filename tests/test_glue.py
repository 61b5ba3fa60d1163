"""GLUE loading from TSVs (fixtures, malformed files, real copy), the trained tokenizer, and minibatches."""

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite.config import paths
from suite.harness.data import MiniBatch
from suite.tasks import glue
from suite.tasks.tokenizer import SPECIAL_TOKENS, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "glue"
# The real GLUE copy, where the documented setting names one (SUITE_GLUE_DIR, as `--data-dir` sets it); a clone
# without it skips the test that reads it.
REAL = Path(os.environ.get(paths.GLUE_DIR_ENV) or "/nonexistent")
PAIR_TASKS = {"mrpc", "rte", "stsb", "qnli"}
SPLITS = [(t, s) for t in glue.TASKS for s in ("train", "dev") if (t, s) != ("qnli", "train")]


def _all_texts(data_dir=FIXTURES):
    texts = []
    for task, split in SPLITS:
        ds = glue.load_split(task, split, data_dir)
        texts += list(ds["text_a"]) + [b for b in ds["text_b"] if b is not None]
    return texts


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("datasets")  # trained on the loaded fixture splits
    return load_tokenizer(None, _all_texts(), vocab_size=512)


# ---- loading ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task,split", SPLITS)
def test_fixture_splits_load(task, split):
    pytest.importorskip("datasets")
    ds = glue.load_split(task, split, FIXTURES)
    t = glue.TASKS[task]
    assert ds.column_names == ["text_a", "text_b", "label"]
    assert len(ds) == (64 if split == "train" else 32)
    assert all(isinstance(a, str) and a for a in ds["text_a"])
    if task in PAIR_TASKS:
        assert all(isinstance(b, str) and b for b in ds["text_b"])
    else:
        assert all(b is None for b in ds["text_b"])
    labels = list(ds["label"])
    if t.num_labels == 1:
        assert ds.features["label"].dtype == "float32"
        assert all(isinstance(x, float) and 0.0 <= x <= 5.0 for x in labels)
    else:
        assert ds.features["label"].dtype == "int64"
        assert set(labels) <= set(range(t.num_labels)) and len(set(labels)) >= 1


def _raw_rows(folder, split, header):
    with open(FIXTURES / folder / f"{split}.tsv", encoding="utf-8-sig", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[1:] if header else rows


def test_label_mappings_and_metrics():
    assert glue.TASKS["rte"].label_map == glue.TASKS["qnli"].label_map == {"entailment": 0, "not_entailment": 1}
    for task in ("cola", "sst2", "mrpc"):
        assert glue.TASKS[task].label_map == {"0": 0, "1": 1}
    assert glue.TASKS["stsb"].label_map is None and glue.TASKS["stsb"].num_labels == 1
    assert glue.TASKS["cola"].metrics == ("matthews",) and glue.TASKS["mrpc"].metrics == ("f1", "accuracy")
    assert glue.TASKS["stsb"].metrics == ("pearson", "spearman")


def test_loaded_rows_match_the_raw_files():
    pytest.importorskip("datasets")
    # Each loaded row matches the raw file through the mapping (CoLA: label field 1, sentence field 3).
    raw = _raw_rows("RTE", "train", True)
    ds = glue.load_split("rte", "train", FIXTURES)
    assert list(ds["label"]) == [{"entailment": 0, "not_entailment": 1}[r[3]] for r in raw]
    assert ds[0]["text_b"] == raw[0][2]
    raw = _raw_rows("CoLA", "train", False)
    ds = glue.load_split("cola", "train", FIXTURES)
    assert list(ds["label"]) == [int(r[1]) for r in raw] and list(ds["text_a"]) == [r[3] for r in raw]
    raw = _raw_rows("MRPC", "dev", True)  # header has a BOM; 'Quality' must still be found
    ds = glue.load_split("mrpc", "dev", FIXTURES)
    assert list(ds["label"]) == [int(r[0]) for r in raw] and ds[0]["text_b"] == raw[0][4]
    ds = glue.load_split("stsb", "dev", FIXTURES)
    assert ds[0]["label"] == 5.0 and ds[1]["label"] == pytest.approx(4.75)
    assert set(glue.load_split("qnli", "dev", FIXTURES)["label"]) == {0, 1}


def test_qnli_train_missing_says_dev_only():
    with pytest.raises(glue.GlueDataError, match=r"QNLI/train\.tsv.*only the 'dev' split"):
        glue.load_split("qnli", "train", FIXTURES)


def test_unknown_task_lists_tasks():
    with pytest.raises(glue.GlueDataError) as err:
        glue.load_split("mnli", "train", FIXTURES)
    assert all(t in str(err.value) for t in glue.TASKS)


RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


@pytest.mark.parametrize(
    "task,folder,text,expected",
    [
        ("rte", "RTE", "index\tsentence1\tsentence2\n0\ta\tb\n", "sentence1, sentence2, label"),
        ("rte", "RTE", RTE_HEADER + "0\ta\tb\tentailment\n1\ta\tnot_entailment\n", "sentence1, sentence2, label"),
        ("rte", "RTE", RTE_HEADER + "0\ta\tb\tmaybe\n", "sentence1, sentence2, label"),
        ("stsb", "STS-B", "sentence1\tsentence2\tscore\na\tb\thigh\n", "sentence1, sentence2, score"),
        ("cola", "CoLA", "gj04\t1\t\tFine.\ngj04\t1\tShort.\n", "source, label, original-label, sentence"),
        ("sst2", "SST-2", "sentence\tlabel\ngood\t2\n", "sentence, label"),
    ],
)
def test_malformed_tsv_names_file_and_columns(tmp_path, task, folder, text, expected):
    path = tmp_path / folder / "train.tsv"
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    with pytest.raises(glue.GlueDataError) as err:
        glue.load_split(task, "train", tmp_path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_binary_junk_names_the_file_and_the_line(tmp_path):
    """Bytes that are not UTF-8 gave a bare UnicodeDecodeError, without the file's name."""
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_bytes(b"sentence\tlabel\ngood\t1\n\xff\xfe\x00junk\t0\n")
    with pytest.raises(glue.GlueDataError, match="line 3 is not UTF-8 text") as err:
        glue.load_split("sst2", "train", tmp_path)
    assert str(path) in str(err.value)


def test_missing_folder(tmp_path):
    with pytest.raises(glue.GlueDataError, match="no .tsv splits"):
        glue.load_split("sst2", "dev", tmp_path)


def test_hub_path_renames_columns(monkeypatch):
    datasets = pytest.importorskip("datasets")

    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        feats = datasets.Features(
            {
                "question": datasets.Value("string"),
                "sentence": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
                "idx": datasets.Value("int32"),
            }
        )
        return datasets.Dataset.from_dict(
            {"question": ["q?"], "sentence": ["s."], "label": [1], "idx": [0]}, features=feats
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    ds = glue.load_split("qnli", "dev")
    assert calls == [("nyu-mll/glue", "qnli", "validation")]
    assert ds.column_names == ["text_a", "text_b", "label"] and ds[0] == {"text_a": "q?", "text_b": "s.", "label": 1}


# ---- tokenizer -------------------------------------------------------------------------------------------


def _vocab_hash(tok):
    return hashlib.sha256(json.dumps(tok.get_vocab(), sort_keys=True).encode()).hexdigest()


def test_tokenizer_deterministic(tokenizer):
    texts = _all_texts()
    again = load_tokenizer(None, texts, vocab_size=512)
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again(texts[:20])["input_ids"] == tokenizer(texts[:20])["input_ids"]
    # tokenizers' own trainer varies between processes (hash order); ours must not.
    code = (
        "from tests.test_glue import _all_texts, _vocab_hash; from suite.tasks.tokenizer import load_tokenizer; "
        "print(_vocab_hash(load_tokenizer(None, _all_texts(), vocab_size=512)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip().splitlines()[-1] == _vocab_hash(tokenizer)


def test_tokenizer_specials_and_pairs(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tokenizer.pad_token_id == 0 and len(tokenizer) <= 512
    enc = tokenizer("A man is playing a flute.", "A man plays the flute.")
    toks = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    first_sep = toks.index("[SEP]")
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]" and toks.count("[SEP]") == 2 and "[UNK]" not in toks
    assert enc["token_type_ids"] == [0] * (first_sep + 1) + [1] * (len(toks) - first_sep - 1)
    single = tokenizer("a man")
    assert tokenizer.convert_ids_to_tokens(single["input_ids"]) == ["[CLS]", "a", "man", "[SEP]"]
    assert set(single["token_type_ids"]) == {0}


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "absent")
    with pytest.raises(ValueError):
        load_tokenizer(None)


# ---- tokenize + batches ----------------------------------------------------------------------------------


def test_tokenize_pads_and_truncates(tokenizer):
    tok = glue.tokenize(glue.load_split("rte", "dev", FIXTURES), tokenizer, max_len=48)
    assert set(tok.column_names) == {"input_ids", "attention_mask", "token_type_ids", "label"}
    rows = tok.with_format("torch")[:]
    assert rows["input_ids"].shape == (32, 48)
    assert ((rows["input_ids"] == 0) == (rows["attention_mask"] == 0)).all()  # pad id 0 exactly where masked
    assert (rows["token_type_ids"] == 1).any(dim=1).all()  # every pair keeps part of sentence B
    assert (rows["input_ids"][:, 0] == tokenizer.cls_token_id).all()
    single = glue.tokenize(glue.load_split("sst2", "dev", FIXTURES), tokenizer, max_len=16).with_format("torch")[:]
    assert single["input_ids"].shape == (32, 16) and (single["token_type_ids"] == 0).all()


@pytest.mark.parametrize("task,dtype", [("rte", torch.long), ("stsb", torch.float32), ("cola", torch.long)])
def test_batches_shapes_dtypes(tokenizer, task, dtype):
    tok = glue.tokenize(glue.load_split(task, "train", FIXTURES), tokenizer, max_len=32)
    got = list(glue.batches(tok, 16, seed=0, epochs=1))
    assert len(got) == 4 and all(isinstance(b, MiniBatch) for b in got)
    for b in got:
        assert b.input_ids.shape == b.attention_mask.shape == b.token_type_ids.shape == (16, 32)
        assert b.input_ids.dtype == b.attention_mask.dtype == b.token_type_ids.dtype == torch.long
        assert b.labels.shape == (16,) and b.labels.dtype == dtype
        assert len(b.split(4)) == 4


def test_batches_seeded_order(tokenizer):
    tok = glue.tokenize(glue.load_split("sst2", "train", FIXTURES), tokenizer, max_len=24)
    ids = tok.with_format("torch")[:]["input_ids"]

    def order(seed, **kw):
        rows = []
        for b in glue.batches(tok, 8, seed=seed, **kw):
            rows += [int((ids == r).all(dim=1).nonzero()[0]) for r in b.input_ids]  # first matching row
        return rows

    a = order(1, epochs=2)
    assert a == order(1, epochs=2) and a != order(2, epochs=2)
    assert a[:64] != a[64:]  # a fresh permutation per epoch
    stream = glue.batches(tok, 8, seed=1)  # endless by default, same stream
    assert [next(stream).input_ids.tolist() for _ in range(16)] == [
        b.input_ids.tolist() for b in glue.batches(tok, 8, seed=1, epochs=2)
    ]
    seq = list(glue.batches(tok, 24, seed=0, shuffle=False, drop_last=False, epochs=1))
    assert [b.size for b in seq] == [24, 24, 16]
    assert torch.equal(torch.cat([b.input_ids for b in seq]), ids)
    with pytest.raises(ValueError, match="cannot draw batches of 65 from 64"):
        glue.batches(tok, 65, seed=0)


# ---- the real GLUE copy (slow) ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not REAL.is_dir(), reason=f"no GLUE copy at {REAL} (set {paths.GLUE_DIR_ENV} to one)")
def test_real_files_row_counts():
    pytest.importorskip("datasets")
    sizes = {}
    for task, split in SPLITS:
        t = glue.TASKS[task]
        data = (REAL / t.folder / f"{split}.tsv").read_bytes()
        lines = data.count(b"\n") + (not data.endswith(b"\n"))  # CoLA/dev.tsv lacks a final newline
        ds = glue.load_split(task, split, REAL)
        assert len(ds) == lines - t.header, (task, split)
        sizes[task, split] = len(ds)
    assert sizes == {
        ("cola", "train"): 8551,
        ("cola", "dev"): 1043,
        ("sst2", "train"): 67349,
        ("sst2", "dev"): 872,
        ("mrpc", "train"): 3668,
        ("mrpc", "dev"): 408,
        ("rte", "train"): 2490,
        ("rte", "dev"): 277,
        ("stsb", "train"): 5749,
        ("stsb", "dev"): 1500,
        ("qnli", "dev"): 5463,
    }
