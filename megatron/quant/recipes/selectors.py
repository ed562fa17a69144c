"""Index selectors: one grammar for the recipe's ``match.layers`` and the capture filters
(TENSOR_SAVE_LAYERS, TENSOR_SAVE_RANKS, TENSOR_SAVE_MICROBATCHES, TENSOR_SAVER_ITERATION lists).

Comma-separated items, each an index ``N`` or an inclusive range ``a-b``; the signed grammar
(the recipe, which knows the layer count only at resolution) also takes negative indices
counting from the end and Python slices ``start:stop``.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Optional

UNSIGNED_GRAMMAR = "non-negative integers and inclusive ranges, comma-separated, e.g. '0,1,15' or '0-3,7'"
SIGNED_GRAMMAR = ("comma-separated indices (negative counts from the end), inclusive ranges 'a-b' "
                  "and Python slices 'start:stop', e.g. '0,-1' or '2-13' or '2:14'")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Selector:
    """One index (negative counts from the end), or the indices ``range(count)[start:stop]``."""

    start: int
    stop: Optional[int]  # None: the single index ``start``

    def matches(self, index: int, count: int) -> bool:
        if index < 0:
            return False
        if self.stop is None:
            return index == (self.start + count if self.start < 0 else self.start)
        return index in range(count)[self.start:self.stop]

    def members(self) -> range:
        """The indices of an unsigned selector (no negative index, no open end)."""
        return range(self.start, self.start + 1 if self.stop is None else self.stop)


def _index(text: str, signed: bool) -> int:
    text = text.strip()
    negative = signed and text.startswith("-")
    digits = text[1:] if negative else text
    if not _DIGITS.fullmatch(digits):
        raise ValueError(f"{text!r} is not an index")
    return -int(digits) if negative else int(digits)


def parse_item(item: Any, *, signed: bool) -> Selector:
    """One item (an int or a string without commas); ValueError saying what is wrong."""
    if isinstance(item, bool) or not isinstance(item, (int, str)):
        raise ValueError(f"{item!r} is not an index")
    if isinstance(item, int):
        if item < 0 and not signed:
            raise ValueError(f"{item!r} is negative")
        return Selector(item, None)
    text = item.strip()
    if signed and ":" in text:
        start, _, stop = text.partition(":")
        return Selector(_index(start, True) if start.strip() else 0,
                        _index(stop, True) if stop.strip() else sys.maxsize)  # open end: to the last index
    if signed and text.startswith("-"):
        return Selector(_index(text, True), None)
    first_text, dash, last_text = text.partition("-")
    first = _index(first_text, False)
    if not dash:
        return Selector(first, None)
    last = _index(last_text, False)
    if last < first:
        raise ValueError(f"range {text!r} is empty")
    return Selector(first, last + 1)


def parse_selectors(value: Any, *, signed: bool) -> tuple[Selector, ...]:
    """An int, a comma-separated string, or a list of them; ValueError saying which item is wrong."""
    items = value if isinstance(value, list) else [value]
    return tuple(parse_item(part, signed=signed)
                 for item in items for part in (item.split(",") if isinstance(item, str) else [item]))


def format_indices(values: Any) -> str:
    """Sorted distinct indices written in the unsigned grammar: [0, 1, 2, 7] -> '0-2,7'."""
    spans: list[list[int]] = []
    for value in values:
        if spans and value == spans[-1][1] + 1:
            spans[-1][1] = value
        else:
            spans.append([value, value])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)
