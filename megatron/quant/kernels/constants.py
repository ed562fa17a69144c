"""The kernels' constants, built from a format's ``KernelContract`` (``formats.contract``) in this one
place: grouped as named tuples that the Triton kernels take as ``tl.constexpr`` arguments and read by
field (``GRID.mbits``). A new grid or scale rule is a new value here and a branch in the kernel that
reads it; the formats themselves are never looked at. Nothing here imports Triton.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from megatron.quant.formats import bits
from megatron.quant.formats.contract import KernelContract
from megatron.quant.formats.grid import BF16_RULE, GridKind, GridRule, Overflow
from megatron.quant.formats.mx import SCALE_MODES

GRID_KINDS: tuple[GridKind, ...] = ("bf16", "minifloat", "hifloat8")  # ``Grid.kind`` indexes this
SCALE_KINDS = ("e8m0", "fp32", "grid")  # ``BlockScale.kind`` indexes this (``contract.BlockScaleEncoding``)
FOUR_OVER_SIX = (None, "mae", "mse")  # ``BlockScale.four_over_six`` indexes this (``contract.ScaleChoice``)


class Grid(NamedTuple):
    """``elementwise.round_grid``'s constants: a grid and its overflow rule."""

    kind: int  # GRID_KINDS
    mbits: int
    min_field: int  # float32 exponent field of the smallest normal binade (minifloat)
    max_field: int  # ... of the largest finite value's binade
    max_value: float
    overflow_inf: bool  # beyond max: +-Inf (NaN without Inf), else saturate
    has_inf: bool
    signed_zero: bool


class BlockScale(NamedTuple):
    """``blocks.block_values``' constants: how a block's scale follows from its amax."""

    kind: int  # SCALE_KINDS
    scale_mode: int  # e8m0: index in ``formats.mx.SCALE_MODES``
    half_ulp: int  # e8m0 "even": half an element ulp in float32 mantissa units
    max_mantissa: int  # e8m0 "rceil": the element max's float32 mantissa
    emax: int  # the element max's exponent
    power_of_two: bool  # fp32: encode rounded down to a power of two
    value_for_inf: float  # fp32: the encode factor where max / amax overflows (the input dtype's max)
    nonfinite_te: bool  # amaxes skip NaN, an Inf amax gives a finite scale
    four_over_six: int  # grid: FOUR_OVER_SIX, the 4over6 error (0: the scale from the amax alone)
    per_row: bool  # grid: one tensor scale per row (the line along the block axis)
    target: float  # grid: the tensor scale's target, global_encode = target / amax (4over6's error divisor)


class Layout(NamedTuple):
    """How ``blocks._block_kernel`` walks a tensor's blocks: a block of ``block`` elements (padded to
    ``padded``), ``side`` long along an axis (tiles: side x side), ``columns`` blocks a program;
    ``transposed`` tiles run down their columns; ``wide``: more blocks than int32 counts."""

    block: int
    padded: int
    side: int
    tiled: bool
    columns: int
    transposed: bool  # tiles walked column by column: W^T's tiles in W (4over6 along axis -2)
    wide: bool = False  # block ids reach 2**31: their divisions in int64 (else int32, a few instructions)


class Rht(NamedTuple):
    """A Hadamard transform applied in the block kernel (``log2`` 0: none)."""

    log2: int
    norm: float
    inverse: bool  # transform the quantized block back before storing it


NO_RHT = Rht(0, 1.0, False)


def _field(exponent: int) -> int:
    return (exponent + bits.EXPONENT_BIAS) << bits.MANTISSA_BITS


def grid(rule: GridRule, overflow: Overflow) -> Grid:
    """The ``Grid`` of a contract's element (or scale) grid."""
    minifloat = rule.kind == "minifloat"
    return Grid(GRID_KINDS.index(rule.kind), rule.mbits, _field(rule.min_exponent) if minifloat else 0,
                _field(rule.max_exponent) if minifloat else 0, float(rule.max_value), overflow == "inf",
                rule.has_inf, rule.signed_zero)


def element_grid(contract: KernelContract) -> Grid:
    return grid(contract.element, contract.overflow)


def block_scale(contract: KernelContract, dtype: torch.dtype) -> BlockScale:
    """The ``BlockScale`` of a block format's contract for inputs of ``dtype``."""
    rule, scale = contract.element, contract.block_scale
    return BlockScale(
        SCALE_KINDS.index(scale.encoding),
        SCALE_MODES.index(scale.scale_mode) if scale.encoding == "e8m0" else 0,
        1 << (bits.MANTISSA_BITS - rule.mbits - 1), bits.mantissa_of(rule.max_value), rule.max_exponent,
        scale.power_of_two,
        float(torch.finfo(dtype).max),  # TE's block kernels: the input dtype's max
        contract.nonfinite_te, FOUR_OVER_SIX.index(scale.four_over_six), contract.per_row,
        float(contract.tensor_scale.target) if contract.tensor_scale is not None else 0.0)


def scale_grid(contract: KernelContract) -> Grid:
    """The grid a "grid" block scale rounds onto (bf16 for the other encodings, which ignore it). A
    constexpr of its own, not a field of ``BlockScale``: Triton 3.6 passes a tuple nested in a
    constexpr tuple on to a ``@triton.jit`` function as plain Python values and fails to compile."""
    return grid(contract.block_scale.grid or BF16_RULE, "saturate")


def rht(contract: KernelContract, direction: Optional[str]) -> Rht:
    """The kernel's transform: the contract's, "forward" or transformed back ("inverse"); None: none."""
    if direction is None:
        return NO_RHT
    transform = contract.transform
    return Rht(transform.size.bit_length() - 1, transform.norm, direction == "inverse")


def stats_bound(contract: KernelContract) -> dict:
    """The overflow constexpr arguments of ``stats.write_stats``."""
    bound, inclusive = contract.overflow_bound
    return dict(BOUND=float(bound), INCLUSIVE=bool(inclusive))
