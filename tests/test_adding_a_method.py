"""The README's "Adding a method" example runs: the code block of docs/adding-a-method.md, registered as written,
passes the oracle against grad_accum (reversed micro-batches within FP32's tolerance, in order bitwise)."""

import os
import re

import pytest

from suite.config.run import RunConfig, apply_overrides
from suite.core import registry
from suite.core.check import check

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "adding-a-method.md")
TINY = ["model.layers=2", "model.hidden=32", "model.heads=2", "model.intermediate=64", "seq_len=8",
        "micro_batch_size=2", "num_micro_batches=3", "device=cpu"]  # fmt: skip


@pytest.fixture
def example():
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    registry.unregister("my-method")
    namespace = {"__name__": "my_method"}
    exec(compile(code, DOC, "exec"), namespace)  # the block as a user copies it into methods/my_method.py
    yield registry.get("my-method")
    registry.unregister("my-method")


@pytest.mark.parametrize("order", ["reverse", "forward"])
def test_the_documented_method_passes_the_oracle(example, order):
    run = apply_overrides(RunConfig(method="my-method"), [*TINY, f"order={order}"], example.options)
    result = check(run, "grad_accum", steps=3)
    assert result.passed, result.report()
    if order == "forward":  # the same arithmetic as grad_accum's
        assert max(result.errors.values()) == 0.0, result.report()


def test_the_documented_method_lists_with_its_description(example, capsys):
    from suite.commands.cli import main

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("my-method"))
    assert "runs a minibatch's micro-batches last to first" in lines[at]
    assert "options: order=reverse (reverse|forward)" in lines[at + 1]  # its options on the line below


@pytest.mark.parametrize("order", ["reverse", "forward"])
def test_the_pages_test_template_passes_and_tells_the_orders_apart(example, order):
    """The page's test template, run as written against its method: at its 4 micro-batches the reversed order
    differs from grad_accum's by rounding (at 2 it would not: a + b is b + a), the forward one not at all."""
    blocks = re.findall(r"```python\n(.*?)```", open(DOC).read(), re.S)
    template = next(b for b in blocks if b.startswith("# tests/test_my_method.py"))
    namespace = {"__name__": "test_my_method"}
    exec(compile(template, DOC, "exec"), namespace)
    namespace["test_my_method_computes_what_grad_accum_computes"](order)
    two = [p for p in namespace["TINY"] if not p.startswith("num_micro_batches")] + ["num_micro_batches=2"]
    run = apply_overrides(RunConfig(method="my-method"), [*two, "order=reverse"], example.options)
    assert max(check(run, "grad_accum", steps=3).errors.values()) == 0.0  # why the page checks at 4
