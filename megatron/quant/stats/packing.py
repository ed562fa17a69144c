"""The packed statistics of a tensor: one float64 vector of counts, extremes, sums and histograms
in a fixed layout, which the torch path (``stats.reference``) and the quantization kernels
(``kernels.stats``) both produce, bit for bit.

Both work tile by tile: a tile is a run of whole quantization blocks (a power of two of them), its
elements taken block by block (``formats.blocks.blocks_in_order``, each block padded with zeros to a
power of two). Each tile gives one row in this layout; ``combine`` folds the rows. Counts, minima
and maxima do not depend on the order of that folding. Sums do, so their order is part of the
definition: float64 terms summed as a tree of adjacent pairs over the elements in that order, padded
with zeros to a power of two. A tile is an aligned subtree of that tree, so the result is the same
whatever the tile size (a kernel's program, the torch path's chunk).

The fields are declared in ``stats.record``'s table (``FIELDS``: each field's name, how rows combine
it, the capture level it belongs to, its width and the functions that compute it). ``layout()``
derives the offsets, the counts prefix and the combine runs from that table as it is when called (a
field added later shows everywhere); the kernels' field constants (``kernels.stats``) derive from it.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor

from megatron.quant.stats import record

IDENTITY = {"sum": 0.0, "min": math.inf, "max": -math.inf}  # a field's value over no element


@dataclass(frozen=True)
class Layout:
    """Where each field of ``fields`` lies in a packed vector, and what follows from that."""

    fields: tuple[record.Field, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"statistics fields named twice: {sorted(n for n in names if names.count(n) > 1)}")
        levels = [f.level for f in self.fields]
        if levels != sorted(levels, key=("counts", "full").index):
            raise ValueError("the counts-level statistics fields must come first (the counts kernels write a prefix)")

    @functools.cached_property
    def starts(self) -> dict[str, int]:
        """Each field's offset."""
        return dict(zip((f.name for f in self.fields), itertools.accumulate((f.width for f in self.fields), initial=0)))

    @property
    def width(self) -> int:
        return sum(f.width for f in self.fields)

    @property
    def counts_width(self) -> int:
        """The exact fields' prefix (capture's counts level): what a counts kernel writes."""
        return sum(f.width for f in self.fields if f.level == "counts")

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.width == 1)

    def span(self, name: str) -> slice:
        """The positions of field ``name``."""
        start = self.starts[name]
        return slice(start, start + next(f.width for f in self.fields if f.name == name))

    @functools.cached_property
    def runs(self) -> tuple[tuple[int, int, record.Combine], ...]:
        """(start, stop, how) runs of consecutive fields that combine alike."""
        return tuple((self.starts[group[0].name], self.starts[group[-1].name] + group[-1].width, how)
                     for how, group in ((how, list(fields))
                                        for how, fields in itertools.groupby(self.fields, lambda f: f.combine)))

    def values(self, packed: Sequence[float]) -> dict[str, Union[float, list[float]]]:
        """Each field's value in ``packed`` (a whole vector, or its counts prefix: then only the exact
        fields); a histogram's as a list. An empty ``packed`` (no element) gives each field's identity."""
        if not len(packed):
            return {f.name: IDENTITY[f.combine] if f.width == 1 else [0.0] * f.width for f in self.fields}
        return {f.name: packed[self.starts[f.name]] if f.width == 1 else list(packed[self.span(f.name)])
                for f in self.fields if self.starts[f.name] + f.width <= len(packed)}


def layout() -> Layout:
    """The layout of ``record.FIELDS`` as the table stands now."""
    return _layout(record.FIELDS)


@functools.lru_cache(maxsize=8)
def _layout(fields: tuple[record.Field, ...]) -> Layout:
    return Layout(fields)


_DERIVED = {"SCALARS": "scalars", "WIDTH": "width", "COUNTS_WIDTH": "counts_width"}


def __getattr__(name: str):
    """``SCALARS``, ``WIDTH`` and ``COUNTS_WIDTH`` of the current layout."""
    if name in _DERIVED:
        return getattr(layout(), _DERIVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pairwise_sum(t: Tensor) -> Tensor:
    """The sums over the last dimension as trees of adjacent pairs, the dimension padded with zeros to
    a power of two. Two terms add alike in any order, so the result is defined to the bit."""
    size = 1 << max(t.shape[-1] - 1, 0).bit_length()
    t = torch.nn.functional.pad(t, (0, size - t.shape[-1])) if size != t.shape[-1] else t.contiguous()
    while t.shape[-1] > 1:
        pairs = t.view(*t.shape[:-1], -1, 2)
        t = pairs[..., 0] + pairs[..., 1]
    return t[..., 0]


def combine(rows: Tensor) -> Tensor:
    """The packed statistics of consecutive tiles (rows of ``COUNTS_WIDTH`` or ``WIDTH`` fields, in
    tile order) as those of their union, on the rows' device (no host sync). Signed zeros come out
    as +0, so padding never shows."""
    rows = rows.double()
    width = rows.shape[1]
    parts = []
    for start, stop, how in layout().runs:
        if start >= width:
            break
        run = rows[:, start:stop]
        parts.append(pairwise_sum(run.t()) if how == "sum" else run.amin(0) if how == "min" else run.amax(0))
    return torch.cat(parts) + 0.0

