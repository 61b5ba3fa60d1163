"""The error every bad config key or value raises, and the "did you mean" hint its messages share."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config key or value that is not accepted; the message names what is."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean a, b?)' naming the closest of `choices` to `word`, or '' when none is close."""
    hits = difflib.get_close_matches(word, list(choices), n=3)
    return f" (did you mean {', '.join(hits)}?)" if hits else ""
