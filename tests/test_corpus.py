"""The pre-training corpus: errors that name what is missing, determinism, held-out split."""

import os

import pytest
import torch

from suite.tasks.corpus import CorpusError, build_corpus, corpus_texts

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "glue")


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(CorpusError, match="does not exist.*train.tsv"):
        corpus_texts(tmp_path / "nowhere")


def test_folder_without_training_files_is_named(tmp_path):
    (tmp_path / "QNLI").mkdir()
    (tmp_path / "QNLI" / "dev.tsv").write_text("index\tquestion\tsentence\tlabel\n")
    with pytest.raises(CorpusError, match=r"no GLUE training file.*RTE/train\.tsv"):
        corpus_texts(tmp_path)


def test_too_little_text_is_named(tmp_path):
    (tmp_path / "SST-2").mkdir()
    (tmp_path / "SST-2" / "train.tsv").write_text("sentence\tlabel\na short one\t1\n")
    with pytest.raises(CorpusError, match="shorter than one block"):
        build_corpus(tmp_path, 64, "clm", 1, 256)


def test_classification_objective_is_refused():
    with pytest.raises(CorpusError, match="mlm or clm"):
        build_corpus(FIXTURES, 32, "classify", 1, 256)


@pytest.mark.parametrize("objective", ["clm", "mlm"])
def test_batches_are_deterministic_and_blocks_full(objective):
    a, b = (build_corpus(FIXTURES, 32, objective, 7, 512) for _ in range(2))
    assert torch.equal(a.train, b.train) and torch.equal(a.valid, b.valid)
    assert a.train.shape[1] == 32 and len(a.valid) > 0
    for step in (0, 5, 40):  # 40 runs past the first epoch
        x, y = a.batch(step, 8), b.batch(step, 8)
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.labels, y.labels)
    assert not torch.equal(a.batch(0, 8).input_ids, a.batch(1, 8).input_ids)
    if objective == "mlm":
        assert (a.train[:, 0] == a.tokenizer.cls_token_id).all() and (a.train[:, -1] == a.tokenizer.sep_token_id).all()
        v1, v2 = a.validation(8), a.validation(8)
        assert all(torch.equal(p.labels, q.labels) for p, q in zip(v1, v2))


def test_validation_texts_are_held_out():
    from suite.tasks.corpus import _held_out

    texts = corpus_texts(FIXTURES)
    held = [t for t in texts if _held_out(t)]
    assert 0 < len(held) < len(texts) // 4
