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


# --- the counter hash (the path CUDA takes): the same contract, in a constant number of operations ---


def _hash_dropped(shape, offset=0, seed=1, step=0, layer=3, sites=1, path="hash", dtype=torch.float32):
    x = torch.ones(shape, dtype=dtype)
    with rng.forced(path), rng.keyed(seed, step, layer, offset):
        out = [rng.keyed_dropout(x, 0.25, True) for _ in range(sites)]
    return out[-1]


def test_hash_split_draws_the_same_masks_as_one_batch():
    whole = _hash_dropped((8, 3, 5, 6))
    parts = torch.cat([_hash_dropped((2, 3, 5, 6), offset=o) for o in (0, 2, 4, 6)])
    assert torch.equal(whole, parts)


def test_hash_masks_are_reproducible_and_depend_on_every_key_part():
    base = _hash_dropped((4, 64))
    assert torch.equal(base, _hash_dropped((4, 64)))
    others = (
        _hash_dropped((4, 64), seed=2),
        _hash_dropped((4, 64), step=1),
        _hash_dropped((4, 64), layer=4),
        _hash_dropped((4, 64), sites=2),
        _hash_dropped((4, 64), offset=4),
    )
    for other in others:
        assert not torch.equal(base, other)


def test_hash_word_statistics():
    u = rng.hash_words((64, 4096), "cpu", 123, 456, 0).double() / 2**32
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.005
    hist = torch.histc(u.flatten().float(), bins=16, min=0, max=1) / u.numel()
    assert (hist - 1 / 16).abs().max() < 0.004
    x = u - 0.5
    assert abs((x[:, 1:] * x[:, :-1]).mean().item()) < 0.002  # neighbouring elements
    assert abs((x[1:] * x[:-1]).mean().item()) < 0.002  # neighbouring samples
    bits = torch.stack([(rng.hash_words((64, 4096), "cpu", 1, 2, 0) >> b) & 1 for b in range(32)]).double()
    assert (bits.mean(dim=(1, 2)) - 0.5).abs().max() < 0.005  # every bit of the word is balanced


def test_hash_dropout_rate_scaling_and_gradient():
    x = torch.ones(32, 1000, requires_grad=True)
    with rng.forced("hash"), rng.keyed(0, 0, 1, 0):
        y = rng.keyed_dropout(x, 0.1, True)
    assert abs((y != 0).float().mean().item() - 0.9) < 0.01
    assert torch.equal(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    y.backward(torch.full_like(y, 2.0))
    assert torch.equal(x.grad, (y != 0).float() * (2.0 * rng._scale(0.1, torch.float32)))  # the same mask again


def test_hash_bits_do_not_depend_on_memory_layout():
    x = torch.randn(4, 6, 5).transpose(1, 2)  # not contiguous
    with rng.forced("hash"), rng.keyed(0, 0, 1, 0):
        a = rng.keyed_dropout(x, 0.5, True)
    with rng.forced("hash"), rng.keyed(0, 0, 1, 0):
        b = rng.keyed_dropout(x.contiguous(), 0.5, True)
    assert torch.equal(a, b)


def test_paths_by_device_and_the_cell_key_they_add():
    assert rng.path_for(torch.device("cpu")) == rng.path_for(torch.device("meta")) == "per_sample"
    assert rng.path_for(torch.device("cuda")) == "hash_triton"  # a device type, no GPU needed
    assert rng.harness_key("cpu") == {}  # every CPU record keeps its key
    assert rng.harness_key("cuda") == {"harness": 2}
    with rng.forced("hash"):
        assert rng.path_for(torch.device("cpu")) == "hash"
    with pytest.raises(ValueError, match="per_sample"):
        with rng.forced("philox"):
            pass


def test_the_cuda_path_needs_no_compiler_and_cannot_fall_back():
    """CUDA's draws are hand-written Triton kernels (their bits: tests/test_kernels.py), not torch.compile: no
    recompile limit to reach, and nothing in rng switches a process to another path."""
    import inspect

    source = inspect.getsource(rng)
    assert "torch.compile" not in source and "_broken" not in source


def _layer_ops(batch: int, path: str) -> int:
    """aten operations dispatched by one BERT block's training forward at micro-batch `batch` (tiny, 16 tokens)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from suite.config.run import ModelConfig
    from suite.harness.data import synthetic_batch
    from suite.harness.model import build_model

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    model = build_model(ModelConfig(), seed=0)
    mb = synthetic_batch(0, batch, 16, 1024, 2, seed=0, padded=True)
    ctx = model.begin(mb, seed=0, step=0, denom=batch)
    x = model.forward_layer(0, mb, ctx)
    with rng.forced(path), Count():
        model.forward_layer(1, x, ctx)
    return Count.n


def test_a_layers_operation_count_does_not_grow_with_the_micro_batch_on_the_hash_path():
    assert _layer_ops(2, "hash") == _layer_ops(64, "hash")
    # The count sees per-sample work where there is some: the CPU's generator draws once per sample and site.
    assert _layer_ops(64, "per_sample") > _layer_ops(2, "per_sample") + 62
