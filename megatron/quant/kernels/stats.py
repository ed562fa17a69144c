"""The statistics of a quantization, taken by the kernel that quantizes: no second pass over the
tensor. Each program writes one float64 row of ``stats.packing``'s layout for its tile: the exact
fields only (``COUNTS``: capture's ``counts`` level, and the exact fields of ``sample``) or all of them
(``FULL``: the ``full`` level); ``stats.packing.combine`` folds the rows on the device. Within a
program the counts are int32 (two to a word) and the extremes float32, one reduction each; only the
sums are float64 (below); overflow is one comparison an element against a threshold a scale.

Counts, minima and maxima do not depend on the order of reduction. The sums are taken in
``packing``'s order: the tile's elements block by block (a 2-D tile is [position in block, block]),
as a tree of adjacent pairs, in float64 without contraction. A program's tile is an aligned subtree
of the whole tensor's tree, so the results equal the torch path's (``stats.reference``) to the bit,
whatever the tiling.
"""
from __future__ import annotations

import collections
import functools
import math
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from megatron.quant.stats import packing, record

NONE, COUNTS, FULL = 0, 1, 2  # what a kernel's STATS constexpr asks for
N_BINS = tl.constexpr(record.N_BINS)
FIRST_FIELD = tl.constexpr(127 + record.LOG2_LOW)  # float32 exponent field of histogram bin 1
COMBINES = ("sum", "min", "max")  # ``Term.combine`` indexes this


@triton.jit
def min_nonzero_term(x, q, is_finite, both):
    """The smallest nonzero finite magnitude: |x| where x is finite and nonzero."""
    return tl.where(is_finite & (x != 0.0), tl.abs(x), float("inf"))


# A field's ``kernel`` in ``stats.record.FIELDS`` names one of these: a function here that writes the
# field out by name (counts, extremes, the sums, the block fields, the histograms), or the key of its
# element term, a ``@triton.jit`` function of (x, q, is_finite, both), bit for bit its torch twin
# (``stats.reference.TERMS``), which ``write_terms`` reduces as the field combines.
WRITERS = ("write_stats", "write_sums", "write_block_stats")
TERMS: dict[str, Any] = {"min_nonzero_term": min_nonzero_term}


class Term(NamedTuple):
    """A field ``write_stats`` reduces from its element term: at ``offset``, by ``COMBINES[combine]``."""

    offset: int
    combine: int
    full: bool  # a full-level field: written only with FULL statistics
    fn: Any  # the term's @triton.jit function


class Row(NamedTuple):
    """``write_stats``' constants, from ``packing``'s layout at launch: the row's width, the offsets of
    the fields it writes out by name (``at.nans``), and the fields it reduces from their terms."""

    width: int
    at: Any  # a named tuple of offsets
    terms: tuple[Term, ...]


NO_ROW = Row(0, (), ())  # a launch without statistics


def stats_row(stats: int) -> Row:
    """The ``Row`` of a launch asked for ``stats`` (NONE, COUNTS or FULL)."""
    return NO_ROW if stats == NONE else _row(packing.layout(), tuple(TERMS.items()), stats)


@functools.lru_cache(maxsize=16)
def _row(layout: packing.Layout, terms: tuple, stats: int) -> Row:
    terms = dict(terms)
    termed = [f for f in layout.fields if f.kernel not in WRITERS]
    missing = [f"{f.name} ({f.kernel})" for f in termed if f.kernel not in terms]
    if missing:
        raise ValueError(f"statistics field(s) {', '.join(missing)} have no kernel term; add them to TERMS of "
                         f"megatron/quant/kernels/stats.py, as FIELDS of megatron/quant/stats/record.py names them")
    at = collections.namedtuple("Offsets", layout.starts)(**layout.starts)
    return Row(layout.width if stats == FULL else layout.counts_width, at,
               tuple(Term(layout.starts[f.name], COMBINES.index(f.combine), not f.exact, terms[f.kernel])
                     for f in termed))


@triton.jit
def in_block_order(t, BLOCKED: tl.constexpr):
    """A tile as a 1-D run in ``packing``'s order: a [position, block] tile block by block."""
    if BLOCKED:  # one return: the GPU compiler types every return of a function alike
        t = tl.reshape(tl.trans(t), (t.shape[0] * t.shape[1],))
    return t


@triton.jit
def pairs(t):
    """A 1-D run as its [n / 2, 2] adjacent pairs."""
    return tl.reshape(t, (t.shape[0] // 2, 2))


@triton.jit
def tree_sum(t, LOG2: tl.constexpr):
    """The sum of a 1-D run of 2**LOG2 (>= 2) values as a tree of adjacent pairs: each level sums
    the rows of a [n / 2, 2] reshape, one addition a pair, the same bits in whatever lanes hold
    them. Not ``tl.split``: its layout has every thread hold the whole run (Triton 3.6, sm_90:
    about 40 KB of stack per thread in the full-statistics kernels; ``bench.gpu.kernel_build``)."""
    for _ in tl.static_range(LOG2 - 1):
        t = tl.sum(pairs(t), axis=1)
    return tl.sum(t, axis=0)


@triton.jit
def finite(x):
    """Neither NaN nor infinite: one comparison (NaN compares false)."""
    return tl.abs(x) < float("inf")


@triton.jit
def flag(where, SHIFT: tl.constexpr):
    """1 << SHIFT where ``where``, else 0: one of the two 16-bit counts an int32 packs."""
    return tl.where(where, 1 << SHIFT, 0)


@triton.jit
def low(word):
    """The count in the low 16 bits of a word of ``flag``s' sums."""
    return (word & 0xFFFF).to(tl.float64)


@triton.jit
def high(word):
    """The count in the high 16 bits (2**15 elements make it the sign bit)."""
    return ((word >> 16) & 0xFFFF).to(tl.float64)


@triton.jit
def log2_bins(x, where, BLOCKED: tl.constexpr):
    """``packing``'s log2 histogram of float32 x where ``where`` (nonzero finite values), N_BINS counts
    (padded to a power of two)."""
    field = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    bins = tl.minimum(tl.maximum(field - FIRST_FIELD + 1, 0), N_BINS - 1)
    return tl.histogram(in_block_order(bins, BLOCKED), 64, mask=in_block_order(where, BLOCKED))


@triton.jit
def next_up(t):
    """The float32 after t >= 0."""
    return (t.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True)


@triton.jit
def overflow_threshold(scale, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr):
    """The least float32 a with a / scale, rounded to nearest, above BOUND (or, ``INCLUSIVE``, at or
    above it); NaN unless scale > 0: |x| overflows exactly where |x| >= this, a few operations a scale
    instead of an IEEE division an element. The quotient rounds beyond BOUND exactly when a / scale, a
    real number, lies above the midpoint m between the last float32 not beyond and the first beyond;
    m has 25 significant bits and the scale 24, so m * scale is exact in float64, and no float32 a
    equals it (its odd part has 25 bits or more): no quotient is a tie, and the threshold is the least
    float32 above m * scale."""
    bound = tl.full((), BOUND, tl.float32).to(tl.int32, bitcast=True)
    if INCLUSIVE:  # the first float32 beyond: BOUND itself, or the one after it
        first = bound
    else:
        first = bound + 1
    low = (first - 1).to(tl.float32, bitcast=True).to(tl.float64)
    middle = (low + first.to(tl.float32, bitcast=True).to(tl.float64)) * 0.5
    product = middle * scale.to(tl.float64)
    t = product.to(tl.float32)  # the nearest float32: the least above the product, or the one below it
    t = tl.where(t.to(tl.float64) < product, next_up(t), t)
    return tl.where(scale > 0.0, t, float("nan"))  # a zero scale zeroes its values: nothing overflows


@triton.jit
def write_stats(row, x, q, xt, scale, valid, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr, STATS: tl.constexpr,
                BLOCKED: tl.constexpr, LOG2: tl.constexpr, ROW: tl.constexpr):
    """This program's row at ``row``: x the float32 values quantized (a 1-D tile, or with ``BLOCKED``
    a [position, block] tile of 2**LOG2 <= 2**15 elements), 0 where not ``valid`` (the elements that
    exist), q their quantized values as stored, xt the values the format divided by ``scale`` (x, or
    its Hadamard transform; broadcast against x: in a block tile, [1, block]; NaN for a block the format
    turned NaN); ``ROW``: where the fields go (``stats_row``). The counts are int32, two to a word
    (16 bits each: at most 2**15 elements), and the counts, minimum and maximum share one reduction;
    the sums share ``tree_sums``."""
    tl.static_assert(LOG2 <= 15, "statistics tiles hold at most 2**15 elements (two 16-bit counts a word)")
    magnitude = tl.abs(x)
    is_finite = valid & finite(x)
    at = tl.abs(xt)
    threshold = overflow_threshold(tl.zeros((), tl.float32) + scale, BOUND, INCLUSIVE)  # also the cast's 1.0
    overflow = valid & ((at >= threshold) | (at == float("inf")))
    nonzero = x != 0.0
    both = is_finite & finite(q)
    if STATS == 2:
        last = flag(overflow, 0) + flag(both, 16)
    else:
        last = flag(overflow, 0)
    words = (tl.sum(flag(x != x, 0) + flag(magnitude == float("inf"), 16), axis=None),
             tl.sum(flag(nonzero, 0) + flag(nonzero & (q == 0.0), 16), axis=None), tl.sum(last, axis=None),
             tl.min(tl.where(is_finite, x, float("inf")), axis=None),
             tl.max(tl.where(is_finite, x, float("-inf")), axis=None))
    tl.store(row + ROW.at.nans, low(words[0]))
    tl.store(row + ROW.at.infs, high(words[0]))
    tl.store(row + ROW.at.nonzero, low(words[1]))
    tl.store(row + ROW.at.underflow, high(words[1]))
    tl.store(row + ROW.at.overflow, low(words[2]))
    tl.store(row + ROW.at.min, words[3].to(tl.float64))
    tl.store(row + ROW.at.max, words[4].to(tl.float64))
    if STATS == 2:
        tl.store(row + ROW.at.both_finite, high(words[2]))
        write_sums(row, x, q, is_finite, both, BLOCKED, LOG2, ROW)
        if BLOCKED:
            write_block_stats(row, magnitude, scale, is_finite, ROW)
        else:
            tl.store(row + ROW.at.block_scale_min, float("inf"))
            tl.store(row + ROW.at.block_scale_positive_min, float("inf"))
            tl.store(row + ROW.at.block_range_max, 0.0)
            tl.store(row + ROW.at.block_scale_max, float("-inf"))
            bins = tl.arange(0, 64)
            tl.store(row + ROW.at.scale_hist + bins, tl.zeros_like(bins).to(tl.float64), mask=bins < N_BINS)
    write_terms(row, x, q, is_finite, both, STATS, BLOCKED, LOG2, ROW)


@triton.jit
def write_terms(row, x, q, is_finite, both, STATS: tl.constexpr, BLOCKED: tl.constexpr, LOG2: tl.constexpr,
                ROW: tl.constexpr):
    """The fields of ``ROW.terms``: each term's values over the tile, reduced as its field combines
    (a sum in ``packing``'s order, in float64)."""
    for i in tl.static_range(len(ROW.terms)):
        if STATS == 2 or not ROW.terms[i].full:
            values = ROW.terms[i].fn(x, q, is_finite, both)
            if ROW.terms[i].combine == 0:
                value = tree_sum(in_block_order(values.to(tl.float64), BLOCKED), LOG2)
            elif ROW.terms[i].combine == 1:
                value = tl.min(values, axis=None).to(tl.float64)
            else:
                value = tl.max(values, axis=None).to(tl.float64)
            tl.store(row + ROW.terms[i].offset, value)


@triton.jit
def write_sums(row, x, q, is_finite, both, BLOCKED: tl.constexpr, LOG2: tl.constexpr, ROW: tl.constexpr):
    """The sums and the log2 histogram of ``write_stats``. The sums are float64 (``packing``'s order
    rounds each pair's sum there); a term's product of two float32 values is exact in it."""
    x64 = in_block_order(tl.where(is_finite, x, 0.0).to(tl.float64), BLOCKED)
    xb = in_block_order(tl.where(both, x, 0.0).to(tl.float64), BLOCKED)
    qb = in_block_order(tl.where(both, q, 0.0).to(tl.float64), BLOCKED)
    error = qb - xb
    tl.store(row + ROW.at.sum, tree_sum(x64, LOG2))
    tl.store(row + ROW.at.sum_squares, tree_sum(x64 * x64, LOG2))
    tl.store(row + ROW.at.signal, tree_sum(xb * xb, LOG2))
    tl.store(row + ROW.at.noise, tree_sum(error * error, LOG2))
    tl.store(row + ROW.at.dot, tree_sum(xb * qb, LOG2))
    tl.store(row + ROW.at.q_power, tree_sum(qb * qb, LOG2))
    bins = tl.arange(0, 64)
    nonzero = is_finite & (x != 0.0)
    tl.store(row + ROW.at.log2_hist + bins, log2_bins(x, nonzero, BLOCKED).to(tl.float64), mask=bins < N_BINS)


@triton.jit
def write_block_stats(row, magnitude, scale, is_finite, ROW: tl.constexpr):
    """The block fields of ``write_stats`` from a [position, block] tile and its [1, block] scales:
    over the blocks holding a nonzero finite value, the largest absmax / min nonzero magnitude, the
    scales' extremes and log2 histogram."""
    magnitude = tl.where(is_finite, magnitude, 0.0)
    block_max = tl.max(magnitude, axis=0)
    block_min = tl.min(tl.where(magnitude == 0.0, float("inf"), magnitude), axis=0)
    block_scale = tl.reshape(scale, (scale.shape[1],))
    used = (block_max > 0.0) & finite(block_scale)
    positive = used & (block_scale > 0.0)
    ratio = tl.where(used, block_max.to(tl.float64) / block_min.to(tl.float64), 0.0)
    tl.store(row + ROW.at.block_range_max, tl.max(ratio, axis=None))
    tl.store(row + ROW.at.block_scale_min, tl.min(tl.where(used, block_scale, float("inf")), axis=None).to(tl.float64))
    tl.store(row + ROW.at.block_scale_max, tl.max(tl.where(used, block_scale, float("-inf")), axis=None).to(tl.float64))
    tl.store(row + ROW.at.block_scale_positive_min,
             tl.min(tl.where(positive, block_scale, float("inf")), axis=None).to(tl.float64))
    bins = tl.arange(0, 64)
    tl.store(row + ROW.at.scale_hist + bins, log2_bins(block_scale, positive, False).to(tl.float64), mask=bins < N_BINS)


def stats_rows(programs: int, stats: int, device: torch.device) -> Tensor:
    """The kernel's output rows for ``programs`` programs asked for ``stats`` (COUNTS or FULL)."""
    return torch.empty((programs, stats_row(stats).width), dtype=torch.float64, device=device)


@triton.jit
def write_abs_max(rows_ptr, x, valid):
    """This program's row of (max |x| over the non-NaN elements, NaN count); x is 0 where not valid
    (no effect on a max of magnitudes)."""
    nan = x != x
    row = rows_ptr + tl.program_id(0).to(tl.int64) * 2
    tl.store(row, tl.max(tl.where(nan, 0.0, tl.abs(x)), axis=None))
    tl.store(row + 1, tl.sum((nan & valid).to(tl.int32), axis=None).to(tl.float32))


def abs_max_rows(programs: int, device: torch.device) -> Tensor:
    """The rows ``write_abs_max`` fills for ``programs`` programs."""
    return torch.empty((programs, 2), dtype=torch.float32, device=device)


def fold_abs_max(rows: Tensor, skip_nan: bool) -> Tensor:
    """The amax from the programs' rows of (max |x| over non-NaN, NaN count)."""
    amax = rows[:, 0].amax()
    return amax if skip_nan else torch.where(rows[:, 1].sum() > 0, math.nan, amax)
