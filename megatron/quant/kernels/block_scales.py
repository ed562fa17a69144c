"""Triton device functions of the block formats' scales (``blocks.block_values``): each block's
(encode, decode) factors from its amax, E8M0 powers of two (MX) or FP32 quotients (FP8 blockwise),
and the NaN a block the format turns NaN carries in its decode factor."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def exp2_int(k):
    """Exact 2**k as float32 for int32 k in [-127, 127] (E8M0's range; ``formats.bits.exp2_int``): the
    exponent field, or 2**-127's subnormal bits."""
    return tl.where(k > -127, (k + 127) << 23, 0x00400000).to(tl.float32, bitcast=True)


@triton.jit
def mx_scales(amax, SCALE: tl.constexpr):
    """(encode, decode) powers of two from block amaxes (``mx.mx_scale_exponent``): an Inf amax (te)
    gives E8M0's 0xFE; a block the format turns NaN takes its NaN from ``nan_where``."""
    amax_bits = amax.to(tl.int32, bitcast=True)
    if SCALE.scale_mode == 2:  # even: the mantissa rounded to the element's width first (a carry bumps the exponent)
        amax_bits = amax_bits + SCALE.half_ulp
    exponent = ((amax_bits >> 23) & 0xFF) - 127 - SCALE.emax
    if SCALE.scale_mode == 1:  # ceil
        exponent = exponent + ((amax_bits & 0x7FFFFF) != 0).to(tl.int32)
    elif SCALE.scale_mode == 3:  # rceil
        exponent = exponent + ((amax_bits & 0x7FFFFF) > SCALE.max_mantissa).to(tl.int32)
    exponent = tl.minimum(tl.maximum(exponent, -127), 127)
    exponent = tl.where(amax == float("inf"), 127, exponent)  # nonfinite="te": E8M0 0xFE
    return exp2_int(-exponent), exp2_int(exponent)


@triton.jit
def fp8_block_scales(amax, MAX_VALUE: tl.constexpr, POWER_OF_TWO: tl.constexpr, VALUE_FOR_INF: tl.constexpr):
    """(encode, decode) from block amaxes: ``base.encode_scale`` (TE's rule, an overflow gives
    ``VALUE_FOR_INF``, an Inf amax 1), IEEE division."""
    encode = tl.math.div_rn(tl.full(amax.shape, MAX_VALUE, tl.float32), amax)
    encode = tl.where(encode == float("inf"), VALUE_FOR_INF, encode)
    encode = tl.where((amax > 0) & (encode > 0), encode, 1.0)
    if POWER_OF_TWO:  # 2**k, k in [-126, 127]: 1 / encode is 2**-k, exactly, from the exponent field
        field = encode.to(tl.int32, bitcast=True) & 0x7F800000
        return field.to(tl.float32, bitcast=True), exp2_int(127 - (field >> 23))
    return encode, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), encode)


@triton.jit
def nan_where(nonfinite, decode, NONFINITE_TE: tl.constexpr):
    """A block's decode factor, NaN for a block the format turns NaN (propagate): the block's values,
    each multiplied by it, turn NaN with it, and its scale too."""
    if NONFINITE_TE:
        return decode
    return tl.where(nonfinite, float("nan"), decode)
