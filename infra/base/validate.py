"""One small validator for the three files gputrain reads: the stack config, a hosts file and the
stack outputs. The checks are shared; each file words its one-line errors its own way (the
`describe` function), so every message names the setting, the bad value and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from infra.base.errors import GputrainError

#: (field, bad value, what is allowed) -> the one line the user reads.
Describe = Callable[[str, Any, str], str]


@dataclass(frozen=True)
class Checker:
    """Raises `error(describe(field, value, allowed))` for the first value that does not fit."""

    describe: Describe
    error: Callable[[str], GputrainError]

    def fail(self, field: str, value: Any, allowed: str) -> GputrainError:
        """The error to raise for one bad value (returned, so callers write `raise c.fail(...)`)."""
        return self.error(self.describe(field, value, allowed))

    def check(self, ok: bool, field: str, value: Any, allowed: str) -> None:
        if not ok:
            raise self.fail(field, value, allowed)

    def typed(self, field: str, value: Any, kind: type | tuple[type, ...], allowed: str) -> Any:
        """`value` is a `kind` (a bool is never a number) and not empty."""
        is_bool = isinstance(value, bool) and bool not in (
            kind if isinstance(kind, tuple) else (kind,)
        )
        empty = value == "" or (isinstance(value, list | Mapping) and not value)
        self.check(isinstance(value, kind) and not is_bool and not empty, field, value, allowed)
        return value

    def integer(self, field: str, value: Any, lo: int, hi: int, allowed: str) -> int:
        """A whole number (not a bool, not a string) in lo..hi."""
        ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
        self.check(ok, field, value, allowed)
        return int(value)

    def matches(self, field: str, value: Any, pattern: re.Pattern[str], allowed: str) -> str:
        self.check(isinstance(value, str) and bool(pattern.match(value)), field, value, allowed)
        return str(value)

    def one_of(self, field: str, value: Any, options: Collection[Any], allowed: str = "") -> Any:
        self.check(value in options, field, value, allowed or f"allowed: {', '.join(options)}")
        return value

    def known_keys(
        self, mapping: Mapping[str, Any], keys: Collection[str], field: Callable[[str], str]
    ) -> None:
        """Every key of `mapping` is one of `keys`; the first stranger is named with its value."""
        unknown = [k for k in mapping if k not in keys]
        if unknown:
            k = unknown[0]
            raise self.fail(field(k), mapping[k], f"allowed keys: {', '.join(keys)}")
