"""Each method's step reads the device back once: its loss (with, under fp16 scaling, the overflow flag in the
same transfer). Counted on the CPU by patching the reads a device would wait for."""

import collections
import traceback

import pytest
import torch

from suite.config.run import RunConfig
from suite.core.check import build_method
from suite.harness.data import synthetic_batches
from suite.harness.device import reading_host

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu")


def _reads_of_one_step(monkeypatch, method, precision, **options):
    run = RunConfig(
        method=method, precision=precision, micro_batch_size=2, num_micro_batches=2, options=options
    ).validate()
    subject = build_method(run, torch.device("cpu"))
    batches = synthetic_batches(run, padded=True)  # padded: the mask's decision is taken too
    subject.step(next(batches))  # the first step builds what steps keep
    batch = next(batches)
    seen = collections.Counter()

    def counting(name, original):
        def read(self, *args, **kwargs):
            if not reading_host():  # host_flag: a host optimizer's flags, already on the host
                where = traceback.extract_stack(limit=3)[-2]
                seen[f"{name} at {where.filename.rsplit('/', 3)[-1]}:{where.lineno}"] += 1
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    stats = subject.step(batch)
    monkeypatch.undo()
    return seen, stats


@pytest.mark.parametrize(
    "method, precision, options",
    [
        ("grad_accum", "fp32", {}),
        ("grad_accum", "fp32", {"recompute": "on"}),
        ("amp", "fp16", {}),
        ("amp", "bf16", {}),
        ("l2l", "fp32", {}),
        ("l2l", "fp32", {"overlap": "on"}),
        ("l2l-cmp", "fp16", {}),
        ("l2l-cmp", "fp16", {"overlap": "on"}),
        ("gpipe", "fp32", {}),
        ("pipedream-flush", "fp32", {}),
        ("pipedream-2bw", "fp32", {}),
        ("2bw-reference", "fp32", {}),
    ],
)
def test_a_step_reads_the_device_back_once(monkeypatch, method, precision, options):
    seen, stats = _reads_of_one_step(monkeypatch, method, precision, **options)
    assert sum(seen.values()) == 1, f"{method}: {dict(seen)}"
    assert stats.loss == stats.loss  # the one read is the loss (not NaN)


def test_the_counter_sees_a_read_inside_a_step(monkeypatch):
    """Not vacuous: a mask decided on the device (as the BERT family did before) is one more read."""
    from suite.harness import data

    monkeypatch.setattr(data, "_attended", lambda mask, rows: None)  # every batch looks made on a device
    seen, _ = _reads_of_one_step(monkeypatch, "grad_accum", "fp32")
    assert sum(seen.values()) == 3, dict(seen)  # one per micro-batch, and the loss
