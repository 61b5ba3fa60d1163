"""Keyed dropout masks: independent of the micro-batch split and of execution order; sound statistics."""

import pytest
import torch

from suite.harness import rng


def _mask(shape, seed=1, step=0, layer=3, offset=0, sites=1):
    with rng.keyed(seed, step, layer, offset):
        out = [rng.keyed_uniform(torch.Size(shape), torch.device("cpu")) for _ in range(sites)]
    return out[-1]


def test_split_draws_the_same_masks_as_one_batch():
    whole = _mask((8, 5, 6))
    parts = torch.cat([_mask((2, 5, 6), offset=o) for o in (0, 2, 4, 6)])
    assert torch.equal(whole, parts)


def test_masks_are_reproducible_and_depend_on_every_key_part():
    base = _mask((4, 16))
    assert torch.equal(base, _mask((4, 16)))  # a recompute draws the same mask
    for other in (_mask((4, 16), seed=2), _mask((4, 16), step=1), _mask((4, 16), layer=4), _mask((4, 16), sites=2)):
        assert not torch.equal(base, other)


def test_uniform_statistics():
    u = _mask((64, 4096)).flatten()
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    hist = torch.histc(u, bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.004
    # neighbouring elements and samples are uncorrelated
    x = u.view(64, 4096) - 0.5
    assert abs((x[:, 1:] * x[:, :-1]).mean().item()) < 0.002
    assert abs((x[1:] * x[:-1]).mean().item()) < 0.002


def test_dropout_rate_and_scaling():
    x = torch.ones(32, 1000)
    with rng.keyed(0, 0, 1, 0):
        y = rng.keyed_dropout(x, 0.1, True)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.9) < 0.01
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    assert torch.equal(rng.keyed_dropout(x, 0.1, False), x)


def test_unkeyed_dropout_is_an_error():
    with pytest.raises(RuntimeError, match="keyed"):
        rng.keyed_dropout(torch.ones(2, 2), 0.5, True)
