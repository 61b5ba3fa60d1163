"""GLUE dev-set metrics, computed with scikit-learn and scipy rather than by hand."""

from __future__ import annotations

import math
import warnings
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


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(labels, predictions))


def f1(predictions: Sequence, labels: Sequence) -> float:
    """F1 of the positive class (1: MRPC's 'equivalent'); 0 when nothing is predicted positive."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def matthews(predictions: Sequence, labels: Sequence) -> float:
    """Matthews correlation; 0 for a constant prediction (sklearn's convention)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, predictions))


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
