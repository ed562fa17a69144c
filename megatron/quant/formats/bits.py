"""Float32 bit-level helpers: exponent fields and exact powers of two built from integers.

Powers of two are made by writing the exponent field directly, so they are exact, cost one
integer op, and compile to plain bit casts (no ``exp2``/``log2`` whose rounding is libm's).
"""
import struct

import torch
from torch import Tensor

MANTISSA_BITS = 23
EXPONENT_BIAS = 127
EXPONENT_FIELD_MASK = 0x7F800000
MANTISSA_MASK = 0x007FFFFF
MIN_NORMAL_EXPONENT = -126
MAX_NORMAL_EXPONENT = 127


def exponent_field(x: Tensor) -> Tensor:
    """int32 tensor holding float32 x's biased exponent in place (``bits & 0x7F800000``).

    Zero and subnormals give 0; Inf and NaN give the all-ones field.
    """
    return x.view(torch.int32) & EXPONENT_FIELD_MASK


def field_of(exponent: int) -> int:
    """The float32 exponent field (as an int32 value) of 2**exponent, a normal number."""
    if not MIN_NORMAL_EXPONENT <= exponent <= MAX_NORMAL_EXPONENT:
        raise ValueError(f"2**{exponent} is not a normal float32")
    return (exponent + EXPONENT_BIAS) << MANTISSA_BITS


def unbiased_exponent(x: Tensor) -> Tensor:
    """floor(log2|x|) for normal float32 x, as int32; -127 for zero/subnormals, 128 for Inf/NaN."""
    return (exponent_field(x) >> MANTISSA_BITS) - EXPONENT_BIAS


def mantissa(x: Tensor) -> Tensor:
    """The 23 stored mantissa bits of float32 x, as int32."""
    return x.view(torch.int32) & MANTISSA_MASK


def exp2_int(k: Tensor) -> Tensor:
    """Exact 2**k as float32 for int32 k in [-149, 127] (subnormal results included)."""
    normal_part = k.clamp(MIN_NORMAL_EXPONENT, MAX_NORMAL_EXPONENT)
    subnormal_part = k - normal_part  # in [-23, 0]: a second factor keeps both normal
    return pow2_from_exponent(normal_part) * pow2_from_exponent(subnormal_part)


def pow2_from_exponent(k: Tensor) -> Tensor:
    """2**k as float32 for int32 k in the normal range [-126, 127]."""
    return ((k + EXPONENT_BIAS) << MANTISSA_BITS).view(torch.float32)


def mantissa_of(value: float) -> int:
    """The 23 stored mantissa bits of ``value`` rounded to float32 (pure Python)."""
    return struct.unpack("<I", struct.pack("<f", value))[0] & MANTISSA_MASK


def floor_pow2(x: Tensor) -> Tensor:
    """2**floor(log2 x) for positive normal float32 x (the exponent field kept, mantissa cleared);
    Inf stays Inf."""
    return (x.view(torch.int32) & EXPONENT_FIELD_MASK).view(torch.float32)
