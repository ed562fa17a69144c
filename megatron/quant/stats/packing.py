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
"""
from __future__ import annotations

import torch
from torch import Tensor

# Histogram of log2|x| over the nonzero finite values: bin k (1..60) holds 2**(LOG2_LOW+k-1) <= |x| <
# 2**(LOG2_LOW+k); bin 0 holds those below 2**LOG2_LOW, bin 61 those at or above 2**LOG2_HIGH.
LOG2_LOW, LOG2_HIGH = -40, 20
LOG2_EDGES = list(range(LOG2_LOW, LOG2_HIGH + 1))
N_BINS = len(LOG2_EDGES) + 1

# The exact fields (capture's counts level) come first: the counts kernels write just these.
# nans, infs, nonzero of x; underflow: x != 0 quantized to 0; overflow: Inf, or |x / scale| beyond the
# format's saturation bound where the scale is not 0; min and max of the finite elements.
EXACT = ("nans", "infs", "nonzero", "underflow", "overflow", "min", "max")
# both_finite: elements finite in x and in q, over which signal = sum x^2, noise = sum (q - x)^2,
# dot = sum x q and q_power = sum q^2 run; sum and sum_squares run over the finite x.
SUMS = ("both_finite", "sum", "sum_squares", "signal", "noise", "dot", "q_power")
# Over the blocks holding a nonzero finite value ("used"): the largest block absmax / block min nonzero
# |x| (0 when none), their scales' min and max, the min of their positive scales.
MINIMA = ("min_nonzero", "block_scale_min", "block_scale_positive_min")
MAXIMA = ("block_range_max", "block_scale_max")
SCALARS = EXACT + SUMS + MINIMA + MAXIMA
FIELD = {name: index for index, name in enumerate(SCALARS)}
LOG2_HIST = slice(len(SCALARS), len(SCALARS) + N_BINS)  # of the nonzero finite x
SCALE_HIST = slice(LOG2_HIST.stop, LOG2_HIST.stop + N_BINS)  # of the used blocks' positive scales
WIDTH = SCALE_HIST.stop
COUNTS_WIDTH = len(EXACT)
# (start, stop, how) runs of the layout: how a field of several rows combines.
_SUMS_END, _MINIMA_END = COUNTS_WIDTH + len(SUMS), COUNTS_WIDTH + len(SUMS) + len(MINIMA)
_RUNS = ((0, FIELD["min"], "sum"), (FIELD["min"], FIELD["max"], "min"), (FIELD["max"], COUNTS_WIDTH, "max"),
         (COUNTS_WIDTH, _SUMS_END, "sum"), (_SUMS_END, _MINIMA_END, "min"), (_MINIMA_END, len(SCALARS), "max"),
         (len(SCALARS), WIDTH, "sum"))


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
    for start, stop, how in _RUNS:
        if start >= width:
            break
        run = rows[:, start:stop]
        parts.append(pairwise_sum(run.t()) if how == "sum" else run.amin(0) if how == "min" else run.amax(0))
    return torch.cat(parts) + 0.0

