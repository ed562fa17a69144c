"""HiFloat8 ("Ascend HiFloat8 Format for Deep Learning"): 8 bits with tapered precision.

Code layout: sign | dot | exponent | mantissa. The dot field is a prefix code giving the
width D of the exponent field and with it the mantissa width M (D + M fill the rest):

    dot    D  M   binades |e|   example
    0000   -  3   denormal      0 0000 mmm = 2**(mmm - 23)  (mmm = 0: zero, or NaN with sign)
    0001   0  3   0             0 0001 000 = 1.0
    001    1  3   1             0 001 s 000 = 2**(+-1)
    01     2  3   2..3          0 01 s x 000
    10     3  2   4..7          0 10 s xx 00
    11     4  1   8..15         0 11 s xxx 0

The exponent field is sign-magnitude with an implicit leading one: sign s, then the bits of
|e| below its top bit. 0x6F/0xEF (e = 15, mantissa 1) are +-Inf; 0x80 is NaN. Values:
126 positive finite ones from 2**-22 to 2**15 = 32768.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from . import bits
from .base import float32_copy
from .elementwise import ElementwiseFormat
from .grid import ElementGrid, GridRule
from .random_bits import RandomBits

NAN_CODE = 0x80
INF_CODE = 0x6F
_DENORMAL_OFFSET = 23  # denormal code m holds 2**(m - 23)
_MIN_EXPONENT = -22
_MAX_EXPONENT = 15
_TWO_POW_23_BITS = 0x4B000000  # float32 2**23: OR-ing a small int t into it gives 2**23 + t
# (dot prefix, its length, exponent width D, mantissa width M); the all-zero dot is the denormals.
_DOT_FIELDS = ((0b11, 2, 4, 1), (0b10, 2, 3, 2), (0b01, 2, 2, 3), (0b001, 3, 1, 3), (0b0001, 4, 0, 3))


def decode_code(code: int) -> float:
    """Value of one HiF8 code, read off the bit layout (pure Python)."""
    sign = -1.0 if code & 0x80 else 1.0
    rest = code & 0x7F
    if code == NAN_CODE:
        return math.nan
    if rest == INF_CODE:
        return sign * math.inf
    for prefix, prefix_bits, exponent_bits, mantissa_bits in _DOT_FIELDS:
        if rest >> (7 - prefix_bits) == prefix:
            field = rest >> mantissa_bits & ((1 << exponent_bits) - 1)
            exponent = 0
            if exponent_bits:
                magnitude = 1 << (exponent_bits - 1) | field & ((1 << (exponent_bits - 1)) - 1)
                exponent = -magnitude if field >> (exponent_bits - 1) else magnitude
            mantissa = rest & ((1 << mantissa_bits) - 1)
            return sign * (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** exponent
    if rest == 0:
        return 0.0
    return sign * 2.0 ** (rest - _DENORMAL_OFFSET)


class HiFloat8Grid(ElementGrid):
    """HiF8 values; round to nearest with ties away from zero.

    Spacing per binade e: |e| <= 3: 2**(e-3); 4..7: 2**(e-2); 8..15 and e = -15: 2**(e-1);
    -22 <= e <= -16: 2**e (denormals are powers of two); below 2**-22 the spacing stays
    2**-22, so 2**-23 ties away up to 2**-22 and anything smaller becomes 0. The top binade
    keeps spacing 2**14 as if 1.5 * 2**15 existed (its code is Inf): everything from
    40960 = 1.25 * 2**15 rounds beyond 32768 and overflows.
    """

    name = "hifp8"
    bits = 8
    max_value = 2.0 ** _MAX_EXPONENT
    min_positive = 2.0 ** _MIN_EXPONENT
    has_inf = True
    ties = "away"
    signed_zero = False  # 0x80 is NaN, so -0 is stored as 0x00

    def spacing_field(self, exponent_field: Tensor) -> Tensor:
        # q = e - (mantissa bits) = e - 3 + c with c = [t >= 4] + [t >= 8] + [t >= 16], t = |e|,
        # i.e. c = clamp(floor(log2 t) - 1, 0, 3), read off float(t)'s exponent. All in place
        # but for t: comparisons and type casts would each cost a full-size temporary.
        e = exponent_field.bitwise_right_shift_(bits.MANTISSA_BITS).sub_(bits.EXPONENT_BIAS)
        e.clamp_(_MIN_EXPONENT, _MAX_EXPONENT)
        t = e.abs().bitwise_or_(_TWO_POW_23_BITS)  # the float 2**23 + t
        t.view(torch.float32).sub_(2.0**23)  # float(t), exactly (t = 0 gives +0)
        c = t.bitwise_right_shift_(bits.MANTISSA_BITS).sub_(bits.EXPONENT_BIAS + 1).clamp_(0, 3)
        return e.add_(c).add_(bits.EXPONENT_BIAS - 3).bitwise_left_shift_(bits.MANTISSA_BITS)

    def code_values(self) -> list[tuple[int, float]]:
        return [(code, decode_code(code)) for code in range(256)]

    @property
    def rule(self) -> GridRule:
        """HiF8's own routine (its spacing per binade is fixed: no constants but the max)."""
        return GridRule("hifloat8", max_value=self.max_value, has_inf=self.has_inf, signed_zero=self.signed_zero)


def codes_of(values: Tensor) -> Tensor:
    """uint8 codes of float32 values that lie on the HiF8 grid (or are +-Inf/NaN)."""
    e = bits.unbiased_exponent(values)
    magnitude = e.abs()
    exponent_width = (magnitude >= 1).int() + (magnitude >= 2).int() + (magnitude >= 4).int() + (magnitude >= 8).int()
    mantissa_width = 3 - (magnitude >= 4).int() - (magnitude >= 8).int()
    dot = torch.where(exponent_width == 4, 0x60, 8 << exponent_width)
    top_bit = 1 << (exponent_width - 1).clamp_min(0)
    exponent_code = torch.where(exponent_width == 0, 0, (e < 0).int() * top_bit + magnitude - top_bit)
    mantissa_code = bits.mantissa(values) >> (bits.MANTISSA_BITS - mantissa_width)
    code = dot + (exponent_code << mantissa_width) + mantissa_code
    code = torch.where(e <= -16, e + _DENORMAL_OFFSET, code)
    code = torch.where(torch.isinf(values), INF_CODE, code)
    code = torch.where(values == 0, 0, code) + (values < 0).int() * 0x80
    code = torch.where(torch.isnan(values), NAN_CODE, code)
    return code.to(torch.uint8)


HIFLOAT8 = HiFloat8Grid()


class HiFloat8Format(ElementwiseFormat):
    """HiF8 fake quantization, plus ``encode``/``decode`` to real 8-bit codes."""

    def __init__(self, options: dict[str, Any]):
        super().__init__("hifp8", HIFLOAT8, options)

    def encode(self, x: Tensor, *, noise: RandomBits | None = None,
               generator: torch.Generator | None = None) -> Tensor:
        """uint8 codes of x rounded onto the HiF8 grid with this format's rounding and
        overflow rule (noise as in ``quantize``). No scaling is applied: with
        ``scaling="tensor"``, encode ``x / scale`` from ``quantize_with_scale``."""
        return codes_of(self._round_(float32_copy(x), x, self._noise(x, noise, generator)))

    @staticmethod
    def decode(codes: Tensor) -> Tensor:
        """float32 values of uint8 HiF8 codes."""
        table = torch.tensor([value for _, value in HIFLOAT8.code_values()], dtype=torch.float32, device=codes.device)
        return table[codes.long()]
