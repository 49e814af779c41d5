"""Reading one mapping of a run configuration into typed values, every problem named by its full path.

The run contract's ``from_dict`` methods (:mod:`atlas_contract.teaching`, :mod:`atlas_contract.run_config`) read
through a :class:`FieldReader`: it never stops at the first problem, so :class:`~atlas_contract.errors.InvalidFields`
lists all of them, each as ``"<path>: expected …, got …"`` (the form the operator's and the trainer's checks share).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

from atlas_contract import checks
from atlas_contract.text import bounded_repr

UNKNOWN_KEY = "unknown configuration key"


def join(prefix: str, key: str) -> str:
    """``prefix.key`` (just ``key`` at the top level)."""
    return f"{prefix}.{key}" if prefix else key


class FieldReader:
    """The values of one mapping at ``prefix``, checked as they are read; problems go to the shared ``problems``."""

    def __init__(self, raw: Mapping[str, Any], prefix: str, problems: list[str]):
        self.raw, self.prefix, self.problems = raw, prefix, problems

    def path(self, key: str) -> str:
        return join(self.prefix, key)

    def setting(self, key: str, default: Any, kinds: tuple[Any, ...], limit: str | None = None) -> Any:
        """A value of one of ``kinds`` within ``LIMITS[limit or key]`` (None: ``default``); the default when wrong."""
        value = self.raw.get(key)
        if value is None:
            return default
        problem = checks.setting_problem(limit or key, value, kinds)
        if problem:
            self.problems.append(f"{self.path(key)}: {problem}")
            return default
        return value

    @overload
    def text(self, key: str, default: str, required: str | None = None) -> str: ...
    @overload
    def text(self, key: str, default: None = None, required: str | None = None) -> str | None: ...
    def text(self, key: str, default: str | None = None, required: str | None = None) -> str | None:
        """A non-empty string (None: ``default``, or the ``required`` problem when one is given)."""
        value = self.raw.get(key)
        if value is None:
            if required:
                self.problems.append(f"{self.path(key)}: required ({required})")
            return default
        if not isinstance(value, str) or not value.strip():
            self.problems.append(f"{self.path(key)}: expected a non-empty string, got {bounded_repr(value)}")
            return default
        return value

    def mapping(self, key: str, shape: str) -> Mapping[str, Any] | None:
        """A nested mapping (None when absent or null; a problem naming ``shape`` when not a mapping)."""
        value = self.raw.get(key)
        if value is None or isinstance(value, Mapping):
            return value
        self.problems.append(f"{self.path(key)}: expected a mapping ({shape}), got {bounded_repr(value)}")
        return None

    def unknown_keys(self, known: tuple[str, ...] | list[str], listed: str | None = None) -> None:
        """A problem for each key no part of Atlas reads (a typo is an error, not silently ignored)."""
        for key in self.raw:
            if key not in known:
                self.problems.append(f"{self.path(str(key))}: {UNKNOWN_KEY} (known: {listed or ', '.join(known)})")
