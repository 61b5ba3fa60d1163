"""A registry by name: each entry names its "module:object", imported only when the name is first asked for."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from suite.config.errors import ConfigError, did_you_mean


def load_entry(entry: str) -> Any:
    """The object an entry "package.module:name" names, imported now."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Entry:
    """Where a named thing is defined ("module:object") and what the engine must know of it before importing it."""

    where: str


class Catalogue:
    """Names to entries, given once each: a different second entry of a name is refused, naming both places (the
    same entry again changes nothing). Nothing is imported until `load`, so a name costs no import and registers
    nothing by side effect."""

    def __init__(self, what: str, entries: list[tuple[str, Entry]] = ()):
        self.what = what
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, Any] = {}
        for name, entry in entries:
            self.add(name, entry)

    def add(self, name: str, entry: Entry) -> None:
        """Enter `name`; refused (ValueError) when the name is already entered elsewhere."""
        if name in self._entries and self._entries[name] != entry:
            raise ValueError(
                f"{self.what} {name!r} is entered twice: at {self._entries[name].where} and at {entry.where}"
            )
        self._entries[name] = entry

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def entry(self, name: str) -> Entry:
        """The entry of `name`; an unknown name is a one-line ConfigError with the closest names."""
        if name not in self._entries:
            raise ConfigError(
                f"unknown {self.what} {name!r}{did_you_mean(name, self._entries)}; "
                f"{self.what}s: {', '.join(self.names())}"
            )
        return self._entries[name]

    def load(self, name: str) -> Any:
        """The object `name` enters, imported on first use."""
        if name not in self._loaded:
            self._loaded[name] = load_entry(self.entry(name).where)
        return self._loaded[name]
