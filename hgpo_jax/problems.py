"""Checks that collect every problem of a set of values instead of stopping at the first.

    p = Problems("algo.")
    p.one_of("mode", "zscore", ("mean_std_norm", "mean_norm"))
    p.check(0 <= gamma <= 1, "gamma", gamma, "in [0, 1]")
    p.items   # ["algo.mode='zscore' is not allowed; use one of mean_std_norm, mean_norm", ...]

Each message names the key with its value, says what is wrong and how to fix it; the config
sections and the algorithms' options (`hgpo_jax.algo_specs`) check their fields with it beside
their declarations, and `Config.validate` raises one error listing them all.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any


def closest(key: str, valid: Sequence[str]) -> str | None:
    """The valid name closest to `key` (a case-insensitive match first, then difflib), or None."""
    lower = {v.lower(): v for v in valid}
    if key.lower() in lower:
        return lower[key.lower()]
    close = difflib.get_close_matches(key.lower(), list(lower), n=1, cutoff=0.5)
    return lower[close[0]] if close else None


def suggest(key: str, valid: Sequence[str], prefix: str = "") -> str:
    """' Did you mean prefix+X?' for the closest valid key, or ''."""
    best = closest(key, valid)
    return f" Did you mean {prefix + best!r}?" if best else ""


def is_int(value: Any) -> bool:
    """An integer (Python or NumPy; not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) or \
        type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iu"


def is_number(value: Any) -> bool:
    """A real number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) or \
        type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iuf"


class Problems:
    """Problem messages of the keys under `prefix` (e.g. "algo."), in the order found. A value
    outside its names reads "<key>=<value> is not allowed; use one of ..." in a config, and
    "unknown <key> <value>; expected one of ..." for options built in code (`code=True`)."""

    def __init__(self, prefix: str = "", code: bool = False):
        self.prefix, self.code = prefix, code
        self.items: list[str] = []

    def add(self, message: str) -> None:
        """A problem in words of its own (a rule over several keys)."""
        self.items.append(message)

    def check(self, ok: bool, key: str, value: Any, rule: str) -> None:
        """'<prefix><key>=<value>: must be <rule>' unless ok."""
        if not ok:
            self.items.append(f"{self.prefix}{key}={value!r}: must be {rule}")

    def one_of(self, key: str, value: Any, options: Sequence[str]) -> None:
        """`value` must be one of `options` (the message suggests the closest)."""
        if value not in options and self.code:
            self.items.append(f"unknown {self.prefix}{key} {value!r}; expected one of {tuple(options)}")
        elif value not in options:
            self.items.append(f"{self.prefix}{key}={value!r} is not allowed; use one of "
                              f"{', '.join(options)}" + suggest(str(value), options))

    def at_least(self, key: str, value: Any, low: float) -> None:
        self.check(is_number(value) and value >= low, key, value, f">= {low:g}")

    def positive(self, key: str, value: Any) -> None:
        self.check(is_number(value) and value > 0 and math.isfinite(value), key, value,
                   "a finite number > 0")

    def finite(self, key: str, value: Any) -> None:
        self.check(is_number(value) and math.isfinite(value), key, value, "finite")

    def in_range(self, key: str, value: Any, low: float, high: float, rule: str) -> None:
        """low <= value <= high (finite), else 'must be <rule>'."""
        self.check(is_number(value) and low <= value <= high, key, value, rule)

    def non_negative(self, key: str, value: Any, note: str = "") -> None:
        """A finite number >= 0 (`note`: what 0 means, or why, in parentheses)."""
        self.check(is_number(value) and 0 <= value < math.inf, key, value,
                   "a finite number >= 0" + (f" ({note})" if note else ""))
