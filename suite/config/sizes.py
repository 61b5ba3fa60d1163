"""Byte sizes written for people ('16GiB', '20MB') parsed into integers."""

from __future__ import annotations

import math

from suite.config.errors import ConfigError

MAX_BYTES = 2**60  # an exbibyte: far past any machine, short of a float's overflow

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """'16GiB' -> bytes. Accepts B, KB, MB, GB, TB (powers of 10) and KiB, MiB, GiB, TiB (powers of 2)."""
    s = str(text).strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :] or "b"
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not value > 0 or not math.isfinite(value):
        raise ConfigError(
            f"size {text!r} is not understood: use a positive number with one of "
            "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. 16GiB)"
        )
    if value * _SIZE_UNITS[unit] > MAX_BYTES:
        raise ConfigError(f"size {text!r} is past any machine: at most 1 EiB (1024 PiB) is accepted")
    return int(value * _SIZE_UNITS[unit])
