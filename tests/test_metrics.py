"""GLUE metrics against hand-computed values and their definitions."""

import math

import pytest

from suite.tasks import metrics
from suite.tasks.glue import GlueDataError


def test_accuracy():
    assert metrics.accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == 0.75


def test_f1_of_the_positive_class():
    # tp 2, fp 1, fn 0: precision 2/3, recall 1, F1 = 2PR / (P + R) = 0.8
    assert metrics.f1([1, 1, 1, 0], [1, 1, 0, 0]) == pytest.approx(0.8)
    # tp 1, fp 0, fn 1: precision 1, recall 1/2 -> 2/3
    assert metrics.f1([1, 0, 0, 0], [1, 1, 0, 0]) == pytest.approx(2 / 3)
    assert metrics.f1([0, 0, 0], [1, 0, 1]) == 0.0  # nothing predicted positive


def test_matthews():
    # tp 1, tn 2, fp 0, fn 1: (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = 2 / sqrt(12)
    assert metrics.matthews([1, 0, 0, 0], [1, 1, 0, 0]) == pytest.approx(2 / math.sqrt(12))
    assert metrics.matthews([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
    assert metrics.matthews([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert metrics.matthews([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0  # constant prediction


def _pearson_by_definition(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_pearson_and_spearman():
    # deviations (-1.5, -.5, .5, 1.5) and (-1.5, .5, -.5, 1.5): 4 / sqrt(5 * 5) = 0.8
    assert metrics.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ranks differ by (0, 1, 1, 0): 1 - 6 * 2 / (4 * 15) = 0.8
    assert metrics.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    x, y = [0.5, 1.0, 2.0, 4.0, 4.5], [1.0, 1.1, 3.0, 9.0, 30.0]  # monotone, not linear
    assert metrics.spearman(x, y) == pytest.approx(1.0)
    assert metrics.pearson(x, y) == pytest.approx(_pearson_by_definition(x, y))
    assert metrics.pearson(x, y) < 0.99


def test_correlation_of_a_constant_is_undefined():
    assert math.isnan(metrics.pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert math.isnan(metrics.spearman([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]))


def test_compute_gives_each_task_its_glue_metrics():
    assert metrics.compute("mrpc", [1, 1, 1, 0], [1, 1, 0, 0]) == pytest.approx({"f1": 0.8, "accuracy": 0.75})
    assert metrics.compute("cola", [1, 0, 0, 0], [1, 1, 0, 0]) == pytest.approx({"matthews": 2 / math.sqrt(12)})
    assert metrics.compute("stsb", [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(
        {"pearson": 0.8, "spearman": 0.8}
    )
    for task in ("rte", "sst2", "qnli"):
        assert metrics.compute(task, [0, 1], [0, 0]) == {"accuracy": 0.5}
    assert metrics.headline("cola", {"matthews": 0.5}) == 50.0
    assert metrics.headline("stsb", {"pearson": 0.9, "spearman": 0.1}) == pytest.approx(90.0)


def test_compute_refuses_bad_input():
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        metrics.compute("rte", [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="no labels"):
        metrics.compute("rte", [], [])
    with pytest.raises(GlueDataError, match="accepted tasks"):
        metrics.compute("mnli-typo", [0], [0])
