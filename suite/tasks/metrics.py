"""GLUE dev-set metrics: the classification ones counted here (sklearn's conventions), correlations from scipy.

Accuracy, F1 and Matthews are a few counts, so they need no scikit-learn, which the GPU image lacks;
tests/test_metrics.py checks them against scikit-learn wherever it is installed.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Sequence

from suite.tasks.glue import get_task

# The metric the L2L paper's Table 7 reports per task (its header says "accuracy" throughout; CoLA's and
# STS-B's values are the GLUE conventions, Matthews and Pearson correlation, x100).
HEADLINE = {
    "qnli": "accuracy",
    "sst2": "accuracy",
    "cola": "matthews",
    "stsb": "pearson",
    "mrpc": "accuracy",
    "rte": "accuracy",
}
# The metric shown beside the headline one (GLUE reports F1 with MRPC's accuracy, Spearman with STS-B's Pearson).
SECOND = {"mrpc": "f1", "stsb": "spearman"}


def _pairs(predictions: Sequence, labels: Sequence) -> list[tuple]:
    """(label, prediction) pairs as plain Python numbers (tensors and numpy scalars compare by value)."""
    item = lambda x: x.item() if hasattr(x, "item") else x  # noqa: E731
    return [(item(y), item(p)) for y, p in zip(labels, predictions, strict=True)]


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    pairs = _pairs(predictions, labels)
    return sum(y == p for y, p in pairs) / len(pairs)


def f1(predictions: Sequence, labels: Sequence) -> float:
    """F1 of the positive class (1: MRPC's 'equivalent'); 0 when nothing is predicted positive."""
    pairs = _pairs(predictions, labels)
    tp = sum(y == 1 and p == 1 for y, p in pairs)
    wrong = sum((y == 1) != (p == 1) for y, p in pairs)  # false positives and false negatives
    return 2 * tp / (2 * tp + wrong) if tp else 0.0


def matthews(predictions: Sequence, labels: Sequence) -> float:
    """Matthews correlation (multiclass form, as sklearn's matthews_corrcoef); 0 for a constant prediction."""
    pairs = _pairs(predictions, labels)
    n, correct = len(pairs), sum(y == p for y, p in pairs)
    true, pred = Counter(y for y, _ in pairs), Counter(p for _, p in pairs)
    cov_tp = correct * n - sum(true[k] * pred[k] for k in true)
    cov_tt = n * n - sum(c * c for c in true.values())
    cov_pp = n * n - sum(c * c for c in pred.values())
    return cov_tp / math.sqrt(cov_tt * cov_pp) if cov_tt and cov_pp else 0.0


def _correlation(fn, predictions, labels) -> float:
    """NaN when either side is constant: a correlation is undefined there, and 0 would flatter it."""
    from scipy.stats import ConstantInputWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConstantInputWarning)
        value = float(fn([float(p) for p in predictions], [float(y) for y in labels])[0])
    return value if math.isfinite(value) else math.nan


def pearson(predictions: Sequence, labels: Sequence) -> float:
    from scipy.stats import pearsonr

    return _correlation(pearsonr, predictions, labels)


def spearman(predictions: Sequence, labels: Sequence) -> float:
    from scipy.stats import spearmanr

    return _correlation(spearmanr, predictions, labels)


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}


def compute(task: str, predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """Every GLUE metric of `task` (fractions, not percent): class ids for classification, floats for STS-B."""
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not len(labels):
        raise ValueError("no labels to score")
    return {name: METRICS[name](predictions, labels) for name in get_task(task).metrics}


def headline(task: str, scores: dict[str, float]) -> float:
    """The paper's metric for `task` from `compute`'s result, in percent."""
    return 100.0 * scores[HEADLINE[task]]
