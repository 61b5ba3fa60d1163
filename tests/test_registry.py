"""The method registry: duplicates refused, typos answered with the closest names."""

import pytest

from suite.config.errors import ConfigError
from suite.core import registry


def test_duplicate_names_are_refused():
    cls = registry.get("grad_accum")
    with pytest.raises(ValueError, match="already registered"):

        @registry.register("grad_accum")
        class Other(cls):
            pass


def test_typo_suggests_close_names():
    with pytest.raises(ConfigError, match="did you mean grad_accum"):
        registry.get("grad_acum")


def test_baselines_are_registered():
    assert {"grad_accum", "amp"} <= set(registry.names())
    assert registry.get("amp").precisions == ("fp16", "bf16")
