"""The partitioner's min-max contiguous split is optimal (brute-force check) and well formed."""

import itertools
import random

import pytest

from methods.pipeline.schedules.partition import partition, stage_costs


def _brute(costs, d):
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), d - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def _well_formed(stages, n, d):
    assert len(stages) == d and all(len(r) > 0 for r in stages)
    assert [i for r in stages for i in r] == list(range(n))


def test_optimal_against_brute_force():
    rng = random.Random(0)
    for n in range(1, 9):
        for d in range(1, n + 1):
            for _ in range(6):
                costs = [rng.randint(0, 9) for _ in range(n)]
                stages = partition(costs, d)
                _well_formed(stages, n, d)
                assert max(stage_costs(costs, stages)) == _brute(costs, d)


def test_float_costs_and_typical_transformer():
    # Embedding, 12 equal blocks, a heavier head: the head stage gets fewer blocks.
    costs = [0.5] + [1.0] * 12 + [2.5]
    stages = partition(costs, 4)
    _well_formed(stages, len(costs), 4)
    assert max(stage_costs(costs, stages)) == pytest.approx(_brute(costs, 4))
    assert partition([1.0] * 8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert partition([3.0], 1) == [range(0, 1)]


@pytest.mark.parametrize("costs,d", [([1, 2], 0), ([1, 2], 3), ([], 1), ([1, 2], -1)])
def test_bad_stage_count(costs, d):
    with pytest.raises(ValueError, match="non-empty contiguous stages"):
        partition(costs, d)


def test_negative_cost_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        partition([1, -1, 2], 2)
