"""Index selectors: one grammar for the recipe's ``match.layers`` and the capture filters
(TENSOR_SAVE_LAYERS, TENSOR_SAVE_RANKS, TENSOR_SAVE_MICROBATCHES, TENSOR_SAVER_ITERATION lists).

Comma-separated items, each an index ``N`` or an inclusive range ``a-b``; the signed grammar
(the recipe, which knows the layer count only at resolution) also takes negative indices
counting from the end and Python slices ``start:stop``.
"""
from __future__ import annotations

import bisect
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

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


@dataclass(frozen=True)
class IndexSet:
    """A set of integers kept as sorted, disjoint, non-adjacent inclusive spans ``(first, last)``:
    membership, bounds and clipping cost the number of spans, never the number of members, so
    ``0-99999999999`` is two integers, not a list (iterate only what a run can reach)."""

    spans: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, spans: Iterable[tuple[int, int]]) -> "IndexSet":
        """From any inclusive spans (overlapping, unordered, empty ones dropped)."""
        merged: list[list[int]] = []
        for first, last in sorted((a, b) for a, b in spans if a <= b):
            if merged and first <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        return cls(tuple((a, b) for a, b in merged))

    @classmethod
    def from_values(cls, values: Iterable[int]) -> "IndexSet":
        return cls.of((v, v) for v in values)

    @classmethod
    def from_selectors(cls, selectors: Iterable[Selector]) -> "IndexSet":
        """The members of unsigned selectors (no negative index, no open end)."""
        return cls.of((s.start, s.start if s.stop is None else s.stop - 1) for s in selectors)

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        i = bisect.bisect_right(self.spans, value, key=lambda span: span[0]) - 1
        return i >= 0 and self.spans[i][0] <= value <= self.spans[i][1]

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __iter__(self) -> Iterator[int]:
        """Every member in order: only for sets a caller has bounded (``clip``)."""
        for first, last in self.spans:
            yield from range(first, last + 1)

    def count(self) -> int:
        return sum(last - first + 1 for first, last in self.spans)

    def min(self) -> int:
        return self.spans[0][0]

    def max(self) -> int:
        return self.spans[-1][1]

    def clip(self, first: Optional[int] = None, last: Optional[int] = None) -> "IndexSet":
        """The members within ``first..last`` (inclusive; None: unbounded)."""
        return IndexSet.of((a if first is None else max(a, first), b if last is None else min(b, last))
                           for a, b in self.spans)

    def union(self, other: "IndexSet") -> "IndexSet":
        return IndexSet.of(self.spans + other.spans)

    def difference(self, values: Iterable[int]) -> "IndexSet":
        """The members that are not among ``values`` (a finite collection)."""
        holes = sorted(set(values))
        spans = []
        for first, last in self.spans:
            start = bisect.bisect_left(holes, first)
            for hole in holes[start:bisect.bisect_right(holes, last)]:
                spans.append((first, hole - 1))
                first = hole + 1
            spans.append((first, last))
        return IndexSet.of(spans)

    def __str__(self) -> str:
        """The unsigned grammar: '0-2,7'."""
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.spans)


def format_indices(values: Iterable[int]) -> str:
    """Distinct indices written in the unsigned grammar: [0, 1, 2, 7] -> '0-2,7'."""
    return str(IndexSet.from_values(values))
