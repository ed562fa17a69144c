"""OCP Microscaling (MX v1.0): blocks of 32 elements sharing a power-of-two E8M0 scale.

Scale exponent per block, clamped to E8M0's finite range [-127, 127] (torchao's
``ScaleCalculationMode`` names):
- ``scale_mode="floor"`` (OCP): floor(log2(amax_block)) - emax_elem;
- ``scale_mode="ceil"``: ceil(log2(amax_block)) - emax_elem;
- ``scale_mode="even"``: amax_block's mantissa rounded to the element's mantissa width
  first (a carry moves it to the next power of two), then as floor;
- ``scale_mode="rceil"`` (NVIDIA hardware): ceil(log2(amax_block / elem_max)), computed
  exactly from the bits. Transformer Engine multiplies amax by a float32 1/elem_max first
  (``quantize_mxfp8.cuh``, ``amax * max_norm_rcp``); for amax exactly elem_max * 2**k both give
  2**k (the product rounds to 2**k in float32), so the two agree there.
``block_shape=(32, 32)`` shares one scale per 32 x 32 tile; ``hadamard=n`` quantizes a random
Hadamard transform of x (``hadamard.py``).
Elements are x / scale rounded onto the element grid (nearest-even or stochastic) and
saturated to the element's max. An all-zero block stays zero. Inf or NaN anywhere in a
block makes its scale NaN (E8M0 0xFF) and so the whole block NaN, as the OCP reference
implementation (microxcaling) does: one non-finite value hides the block's other values.
With ``nonfinite="te"`` the block amax skips NaN (fmaxf) and an Inf amax gives E8M0 0xFE
(2**127), as TE's ``float_to_e8m0`` (``ptx_arch_spec.cuh``): the finite elements are cast with
that scale (Inf saturates to the element max; NaN stays NaN).
"""
from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from . import bits
from .blocks import GridBlockFormat
from .contract import BlockScale
from .grid import Minifloat

ScaleMode = Literal["floor", "ceil", "even", "rceil"]
"""The ``scale_mode`` option of the MX formats: how a block's E8M0 exponent follows from its amax
(the module docstring gives each rule; ``"floor"`` is OCP's, ``"rceil"`` NVIDIA hardware's)."""
SCALE_MODES: tuple[ScaleMode, ...] = get_args(ScaleMode)
MX_BLOCK_SIZE = 32
E8M0_MIN_EXPONENT = -127
E8M0_MAX_EXPONENT = 127


def mx_scale_exponent(block_amax: Tensor, element: Minifloat, scale_mode: ScaleMode) -> Tensor:
    """int32 E8M0 scale exponent for each block amax (Inf/NaN blocks are handled by the caller)."""
    if scale_mode == "even":
        # Add half an element ulp to the float32 bits: a carry reaches the exponent exactly when
        # the rounded mantissa overflows. (Ties round up here, but a tie that rounds to even
        # downward never carries, so the exponent is the same as with ties to even.)
        half_ulp = 1 << (bits.MANTISSA_BITS - element.mbits - 1)
        block_amax = (block_amax.view(torch.int32) + half_ulp).view(torch.float32)
    exponent = bits.unbiased_exponent(block_amax) - element.max_exponent
    if scale_mode == "ceil":
        exponent = exponent + (bits.mantissa(block_amax) != 0).int()
    elif scale_mode == "rceil":
        # amax / max = (mantissa ratio) * 2**(e_amax - e_max): its ceil(log2) is one more
        # exactly when amax's significand exceeds max's.
        exponent = exponent + (bits.mantissa(block_amax) > bits.mantissa_of(element.max_value)).int()
    return exponent.clamp(E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT)


class MXFormat(GridBlockFormat):
    scale_encoding = "E8M0 (a power of two, 2**-127 .. 2**127) per block"

    def _block_scale(self) -> BlockScale:
        return BlockScale("e8m0", scale_mode=self.options["scale_mode"])

    def _quantize_blocks(self, blocks, block_dim, amax, uniform, split, dtype):
        block_amax = self._abs_max(blocks, dim=block_dim)
        exponent = mx_scale_exponent(block_amax, self.element, self.options["scale_mode"])
        finite = bits.exponent_field(block_amax) != bits.EXPONENT_FIELD_MASK
        if self.options["nonfinite"] == "te":  # no NaN amax left; an Inf one gives E8M0 0xFE
            exponent = torch.where(finite, exponent, E8M0_MAX_EXPONENT)
            finite = torch.ones_like(finite)
        scale = torch.where(finite, bits.exp2_int(exponent), torch.nan)
        scaled = blocks * bits.exp2_int(-exponent)  # exact: a power of two
        elements = self.element.round_(scaled, blocks, self.rounding, "saturate", uniform)
        return elements.mul_(scale), scale, None
