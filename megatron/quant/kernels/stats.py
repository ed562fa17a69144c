"""The exact statistics of a quantization, taken by the kernel that quantizes (capture's ``counts``
level, and the exact fields of ``sample``): no second pass over the tensor.

Each program writes one row of ``WIDTH`` float32 partials, ``FIELDS`` in order; ``reduce_counts``
folds the rows on the device. Counts, minima and maxima do not depend on the order in which they are
reduced, so they equal the torch path's (``capture.stats``) exactly, whatever the tiling. The sums
behind MSE and SQNR do depend on it (torch's float32 reduction order is not a kernel's), so the
``full`` level keeps computing them in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from megatron.quant.formats.saturation import overflow_bound

# nans, infs and nonzero of x; underflow: x != 0 stored as 0; overflow: Inf, or |x / scale| beyond the
# format's saturation bound where the scale is not 0; min and max over the finite elements.
FIELDS = ("nans", "infs", "nonzero", "underflow", "overflow", "min", "max")
WIDTH = 8  # floats per program row (counts per program stay far below 2**24: exact in float32)


@triton.jit
def write_counts(counts_ptr, x, zero, scale, valid, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr):
    """This program's row: x the float32 values quantized, ``zero`` where their quantized values are
    stored as zero, ``scale`` what x was divided by (broadcast against x; NaN for a block the format
    turned NaN), ``valid`` the elements that exist."""
    magnitude = tl.abs(x)
    nan = x != x
    inf = magnitude == float("inf")
    scale = scale + tl.zeros_like(x)
    ratio = tl.math.div_rn(magnitude, scale)  # IEEE division, as the torch path's
    beyond = (ratio >= BOUND) if INCLUSIVE else (ratio > BOUND)
    overflow = (beyond & (scale != 0.0)) | inf
    finite = valid & (x == x) & (magnitude != float("inf"))
    row = counts_ptr + tl.program_id(0).to(tl.int64) * 8
    tl.store(row, tl.sum((valid & nan).to(tl.int32), axis=None).to(tl.float32))
    tl.store(row + 1, tl.sum((valid & inf).to(tl.int32), axis=None).to(tl.float32))
    tl.store(row + 2, tl.sum((valid & (x != 0.0)).to(tl.int32), axis=None).to(tl.float32))
    tl.store(row + 3, tl.sum((valid & zero & (x != 0.0)).to(tl.int32), axis=None).to(tl.float32))
    tl.store(row + 4, tl.sum((valid & overflow).to(tl.int32), axis=None).to(tl.float32))
    tl.store(row + 5, tl.min(tl.where(finite, x, float("inf")), axis=None))
    tl.store(row + 6, tl.max(tl.where(finite, x, float("-inf")), axis=None))


def counts_rows(programs: int, device: torch.device) -> Tensor:
    """The kernel's output rows for ``programs`` programs."""
    return torch.empty((programs, WIDTH), dtype=torch.float32, device=device)


def reduce_counts(rows: Tensor) -> Tensor:
    """``FIELDS`` over every program, as float64 on the rows' device (no host sync)."""
    rows = rows.double()
    return torch.cat([rows[:, :5].sum(0), rows[:, 5].amin(0, keepdim=True), rows[:, 6].amax(0, keepdim=True)])


def bound_constants(fmt) -> dict:
    """The constexpr arguments of ``write_counts`` for ``fmt``."""
    bound, inclusive = overflow_bound(fmt)
    return dict(BOUND=float(bound), INCLUSIVE=bool(inclusive))
