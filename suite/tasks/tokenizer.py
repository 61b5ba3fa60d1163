"""Tokenizers: a local pretrained one, or a small BERT WordPiece trained deterministically on given texts."""

from __future__ import annotations

import os
from typing import Iterable

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4, so [PAD] is 0 as BERT expects


def load_tokenizer(path_or_none: str | os.PathLike | None, texts: Iterable[str] | None = None, vocab_size: int = 1024):
    """`AutoTokenizer` from a local folder, or (path None) a WordPiece tokenizer trained on `texts`.

    The trained one lets random-init tiny models read real text with no download; the same texts
    give the same vocabulary and ids.
    """
    import transformers

    if path_or_none is not None:
        if not os.path.isdir(path_or_none):  # otherwise from_pretrained would take it for a hub repo id
            raise FileNotFoundError(f"no pretrained tokenizer folder at {os.fspath(path_or_none)!r}")
        return transformers.AutoTokenizer.from_pretrained(os.fspath(path_or_none), local_files_only=True)
    if texts is None:
        raise ValueError("load_tokenizer needs a pretrained folder or texts to train a WordPiece vocabulary on")

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    texts = list(texts)
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    # tokenizers' trainer numbers the '##x' continuation tokens in hash-map order, and ties between merges
    # are broken by those ids, so two trainings on the same texts can differ (huggingface/tokenizers#1794).
    # Reserving every '##x' up front, in sorted order, fixes their ids and makes training deterministic.
    tails = sorted(
        {c for t in texts for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(t)) for c in w[1:]}
    )
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, show_progress=False, special_tokens=SPECIAL_TOKENS + ["##" + c for c in tails]
    )
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer, trained.pre_tokenizer = normalizer, pre_tokenizer
    trained.train_from_iterator(texts, trainer=trainer)
    # Rebuild from the learned vocabulary so that only the five real special tokens are "special".
    tok = Tokenizer(models.WordPiece(trained.get_vocab(with_added_tokens=False), unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, pre_tokenizer, decoders.WordPiece()
    tok.add_special_tokens(SPECIAL_TOKENS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
