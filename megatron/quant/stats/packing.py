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

The layout is one table, ``FIELDS``: each field's name, how rows combine it, the capture level it
belongs to and its width. ``layout()`` derives the offsets, the counts prefix and the combine runs
from the table as it is when called (a field added later shows everywhere); the kernels' field
constants (``kernels.stats``) and the record's keys (``stats.record``) derive from it too.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Literal, Sequence, Union

import torch
from torch import Tensor

# Histogram of log2|x| over the nonzero finite values: bin k (1..60) holds 2**(LOG2_LOW+k-1) <= |x| <
# 2**(LOG2_LOW+k); bin 0 holds those below 2**LOG2_LOW, bin 61 those at or above 2**LOG2_HIGH.
LOG2_LOW, LOG2_HIGH = -40, 20
LOG2_EDGES = list(range(LOG2_LOW, LOG2_HIGH + 1))
N_BINS = len(LOG2_EDGES) + 1

Combine = Literal["sum", "min", "max"]
"""How a field of several rows (tiles, blocks, ranks) folds into one: counts and sums add, extremes
take the smaller or the larger."""


@dataclass(frozen=True)
class Field:
    """One field of the layout: its name, how rows combine it, the capture level from which it is
    exact (``"counts"``: the counts kernels write it too; ``"full"``: only a full pass has it) and its
    width (histograms: ``N_BINS`` counts). Both paths write a field out in their own code or reduce it
    from its element term (``TERMS`` of ``stats.reference`` and of ``kernels.stats``), as it combines."""

    name: str
    combine: Combine
    level: Literal["counts", "full"]
    width: int = 1


# The layout, in order; the exact fields (capture's counts level) come first, so the counts kernels
# write a prefix of it. nans, infs, nonzero of x; underflow: x != 0 quantized to 0; overflow: Inf, or
# |x / scale| beyond the format's saturation bound where the scale is not 0; min and max of the finite
# elements. both_finite: elements finite in x and in q, over which signal = sum x^2, noise =
# sum (q - x)^2, dot = sum x q and q_power = sum q^2 run; sum and sum_squares run over the finite x;
# min_nonzero: the smallest nonzero finite |x| (an element term).
# Over the blocks holding a nonzero finite value ("used"): the largest block absmax / block min
# nonzero |x| (0 when none), their scales' min and max, the min of their positive scales. Then the
# log2 histograms of the nonzero finite x and of the used blocks' positive scales.
FIELDS = (
    *(Field(name, "sum", "counts") for name in ("nans", "infs", "nonzero", "underflow", "overflow")),
    Field("min", "min", "counts"), Field("max", "max", "counts"),
    *(Field(name, "sum", "full") for name in ("both_finite", "sum", "sum_squares", "signal", "noise", "dot",
                                              "q_power")),
    *(Field(name, "min", "full") for name in ("min_nonzero", "block_scale_min", "block_scale_positive_min")),
    *(Field(name, "max", "full") for name in ("block_range_max", "block_scale_max")),
    Field("log2_hist", "sum", "full", N_BINS), Field("scale_hist", "sum", "full", N_BINS),
)
IDENTITY = {"sum": 0.0, "min": math.inf, "max": -math.inf}  # a field's value over no element


@dataclass(frozen=True)
class Layout:
    """Where each field of ``fields`` lies in a packed vector, and what follows from that."""

    fields: tuple[Field, ...]

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
    def runs(self) -> tuple[tuple[int, int, Combine], ...]:
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
    """The layout of ``FIELDS`` as the table stands now."""
    return _layout(FIELDS)


@functools.lru_cache(maxsize=8)
def _layout(fields: tuple[Field, ...]) -> Layout:
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

