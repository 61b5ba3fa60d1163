"""GLUE tasks: local TSV (or hub) loading, tokenization and seeded minibatches."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from typing import Iterator

import torch

from suite.harness.data import MiniBatch


class GlueDataError(ValueError):
    """A GLUE file is missing or does not have the expected layout."""


@dataclass(frozen=True)
class GlueTask:
    folder: str  # folder under the GLUE data dir
    text_a: str | int  # column name, or field index for header-less files
    text_b: str | int | None  # None for single-sentence tasks
    label: str | int
    header: bool
    label_map: dict[str, int] | None  # None: float regression target
    num_labels: int
    metrics: tuple[str, ...]
    hub_columns: tuple[str, str | None]  # text columns of nyu-mll/glue (labels there are already ints)
    fields: tuple[str, ...] = ()  # field names of a header-less file (for messages)


# Label orders follow nyu-mll/glue's ClassLabel features, so local files and the hub give the same ids.
_BINARY = {"0": 0, "1": 1}
_NLI = {"entailment": 0, "not_entailment": 1}
TASKS: dict[str, GlueTask] = {
    # CoLA: no header; fields source, label, original-label ('*' etc.), sentence; 0 unacceptable, 1 acceptable.
    "cola": GlueTask(
        "CoLA",
        3,
        None,
        1,
        False,
        _BINARY,
        2,
        ("matthews",),
        ("sentence", None),
        fields=("source", "label", "original-label", "sentence"),
    ),
    "sst2": GlueTask("SST-2", "sentence", None, "label", True, _BINARY, 2, ("accuracy",), ("sentence", None)),
    # MRPC: 0 not_equivalent, 1 equivalent; its header starts with a BOM (read as utf-8-sig).
    "mrpc": GlueTask(
        "MRPC", "#1 String", "#2 String", "Quality", True, _BINARY, 2, ("f1", "accuracy"), ("sentence1", "sentence2")
    ),
    "rte": GlueTask("RTE", "sentence1", "sentence2", "label", True, _NLI, 2, ("accuracy",), ("sentence1", "sentence2")),
    "stsb": GlueTask(
        "STS-B", "sentence1", "sentence2", "score", True, None, 1, ("pearson", "spearman"), ("sentence1", "sentence2")
    ),
    "qnli": GlueTask("QNLI", "question", "sentence", "label", True, _NLI, 2, ("accuracy",), ("question", "sentence")),
}


def get_task(task: str) -> GlueTask:
    if task not in TASKS:
        raise GlueDataError(f"unknown GLUE task {task!r}; accepted tasks: {', '.join(TASKS)}")
    return TASKS[task]


def _expected(t: GlueTask) -> str:
    if t.header:
        cols = [c for c in (t.text_a, t.text_b, t.label) if c is not None]
        return f"{t.folder} needs a header with columns " + ", ".join(map(str, cols))
    return f"{t.folder} needs {len(t.fields)} tab-separated fields and no header: " + ", ".join(t.fields)


def _features(t: GlueTask):
    import datasets

    label = datasets.Value("float32") if t.label_map is None else datasets.Value("int64")
    return datasets.Features({"text_a": datasets.Value("string"), "text_b": datasets.Value("string"), "label": label})


def _utf8_lines(fh, fail):
    """`fh`'s lines; bytes that are not UTF-8 end the read with one line naming the file and the first such line
    (`fail`; the text layer decodes ahead of the lines it hands out, so the line is found in the bytes)."""
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        with open(fh.name, "rb") as raw:
            for n, line in enumerate(raw, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    break
        fail(f"line {n} is not UTF-8 text ({exc.reason}); GLUE's files are UTF-8 TSV")


def _read_tsv(t: GlueTask, path: str) -> dict[str, list]:
    """Rows of one GLUE TSV as text_a/text_b/label lists, checking layout and labels row by row."""

    def fail(msg: str):
        raise GlueDataError(f"{path}: {msg} ({_expected(t)})")

    cols = {"text_a": [], "text_b": [], "label": []}
    # utf-8-sig drops MRPC's BOM; QUOTE_NONE because GLUE text has unbalanced '"' that are not quoting.
    with open(path, encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(_utf8_lines(fh, fail), delimiter="\t", quoting=csv.QUOTE_NONE)
        if t.header:
            header = next(reader, None) or []
            missing = [c for c in (t.text_a, t.text_b, t.label) if c is not None and c not in header]
            if missing:
                fail(f"header {header} lacks column(s) {missing}")
            idx = {c: header.index(c) for c in (t.text_a, t.text_b, t.label) if c is not None}
            width = len(header)
        else:
            idx = {c: c for c in (t.text_a, t.text_b, t.label) if c is not None}
            width = len(t.fields)
        for row in reader:
            if not row:  # a blank line (e.g. a stray trailing one) is not a row
                continue
            if len(row) != width:
                fail(f"line {reader.line_num} has {len(row)} fields instead of {width}")
            raw = row[idx[t.label]]
            if t.label_map is None:
                try:
                    label = float(raw)
                except ValueError:
                    label = math.nan
                if not math.isfinite(label):
                    fail(f"line {reader.line_num}: score {raw!r} is not a finite float")
            elif raw in t.label_map:
                label = t.label_map[raw]
            else:
                fail(f"line {reader.line_num}: label {raw!r} is not one of {list(t.label_map)}")
            cols["text_a"].append(row[idx[t.text_a]])
            cols["text_b"].append(None if t.text_b is None else row[idx[t.text_b]])
            cols["label"].append(label)
    return cols


def check_folder(folder: str, split: str = "") -> str | None:
    """What keeps `folder` from being a folder of GLUE TSVs (no task folder holding a split, or `split` where one is
    named), or None when it is one."""
    names = sorted({t.folder for t in TASKS.values()})
    splits = [split] if split else ["train", "dev"]
    if any(os.path.isfile(os.path.join(folder, n, f"{s}.tsv")) for n in names for s in splits):
        return None
    what = " or ".join(f"{s}.tsv" for s in splits)
    return f"no GLUE task's {what} in it; expected task folders ({', '.join(names)}) holding {what}"


def load_split(task: str, split: str, data_dir: str | os.PathLike | None = None):
    """A split ('train' or 'dev') as a datasets.Dataset with columns text_a, text_b (None if single), label.

    `datasets` is imported only to build the Dataset (the GPU image does not ship it): a wrong task, a
    missing file or a malformed one is reported the same without it.
    """
    t = get_task(task)
    if data_dir is None:  # hub: nyu-mll/glue already has int labels in the same order as TASKS
        import datasets

        ds = datasets.load_dataset("nyu-mll/glue", task, split={"dev": "validation"}.get(split, split))
        a, b = t.hub_columns
        ds = ds.rename_columns({a: "text_a", b: "text_b"} if b else {a: "text_a"})
        if not b:
            ds = ds.add_column("text_b", [None] * len(ds))
        return ds.select_columns(["text_a", "text_b", "label"]).cast(_features(t))
    folder = os.path.join(os.fspath(data_dir), t.folder)
    path = os.path.join(folder, {"validation": "dev"}.get(split, split) + ".tsv")
    if not os.path.isfile(path):
        present = sorted(f[:-4] for f in os.listdir(folder) if f.endswith(".tsv")) if os.path.isdir(folder) else []
        have = (
            f"only the {present[0]!r} split exists in {folder}"
            if len(present) == 1
            else f"splits in {folder}: {present}"
            if present
            else f"{folder} holds no .tsv splits"
        )
        raise GlueDataError(f"{path}: file not found for task {task!r}; {have}")
    # csv + from_dict rather than load_dataset("csv"): pandas would turn sentences like "null"/"NA" into
    # NaN, infer column types, needs extra handling for CoLA's missing header, caches arrow files under
    # ~/.cache, and cannot say which line of which file is malformed.
    cols = _read_tsv(t, path)
    import datasets

    return datasets.Dataset.from_dict(cols, features=_features(t))


def tokenize(dataset, tokenizer, max_len: int):
    """Adds input_ids/attention_mask/token_type_ids (padded to max_len, truncated); drops the texts."""
    pair = any(b is not None for b in dataset["text_b"])

    def encode(rows):
        return tokenizer(
            rows["text_a"],
            rows["text_b"] if pair else None,
            padding="max_length",
            truncation=True,
            max_length=max_len,
            return_token_type_ids=True,
            return_attention_mask=True,
        )

    return dataset.map(encode, batched=True, remove_columns=["text_a", "text_b"])


def batches(
    tokenized, batch_size: int, seed: int, shuffle: bool = True, drop_last: bool = True, epochs: int | None = None
) -> Iterator[MiniBatch]:
    """MiniBatches over `epochs` passes (None: endless), each pass a fresh permutation seeded by (seed, epoch)."""
    cols = ["input_ids", "attention_mask", "token_type_ids", "label"]
    data = tokenized.with_format("torch", columns=cols)[:]
    n = len(tokenized)
    if n == 0 or (drop_last and n < batch_size) or batch_size < 1:
        # an endless iterator would otherwise spin forever without yielding
        raise ValueError(f"cannot draw batches of {batch_size} from {n} samples (drop_last={drop_last})")
    regression = tokenized.features["label"].dtype.startswith("float")
    labels = data["label"].float() if regression else data["label"].long()

    def stream():  # checks above run at the call, not at the first next()
        epoch = 0
        while epochs is None or epoch < epochs:
            order = (
                torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
                if shuffle
                else torch.arange(n)
            )
            for start in range(0, n - n % batch_size if drop_last else n, batch_size):
                i = order[start : start + batch_size]
                yield MiniBatch(
                    data["input_ids"][i].long(),
                    data["attention_mask"][i].long(),
                    data["token_type_ids"][i].long(),
                    labels[i],
                )
            epoch += 1

    return stream()
