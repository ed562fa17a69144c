"""Element grids: the set of values a format's element can hold, and rounding onto it.

A grid is data: for each float32 binade 2**e <= |x| < 2**(e+1) it names the spacing 2**q of
its representable values there, plus its largest finite value, whether it has Inf, and its
tie rule. Rounding is then one vectorised routine for every grid:

    a = x * 2**-q      (exact: a power-of-two scale)
    n = round(a)       (nearest-even, nearest-away or stochastic: ``rounding.py``)
    y = n * 2**q       (exact)

followed by the overflow rule. A value rounding up into the next binade lands on 2**(e+1),
which is always representable, so one spacing per binade suffices. Both 2**q and 2**-q are
built from the exponent field with integer ops, so the whole routine is elementwise,
sync-free and fuses into one kernel under ``torch.compile``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from . import bits
from .rounding import DRAW_BITS, Rounding, is_stochastic, round_half_away_, round_half_even_, round_stochastic_

Overflow = Literal["saturate", "inf"]
"""The ``overflow`` option of unblocked grid formats: what a value beyond the element's max becomes.
``"saturate"``: the max, with its sign (Inf too, as NVIDIA's SATFINITE casts); ``"inf"``: +-Inf, or
NaN where the element has no Inf (IEEE casts). Block formats always saturate."""
OVERFLOW_MODES: tuple[Overflow, ...] = get_args(Overflow)
# Field of 2**-q from field of 2**q: (127 - q) = 254 - (q + 127).
_NEGATE_FIELD = (2 * bits.EXPONENT_BIAS) << bits.MANTISSA_BITS


GridKind = Literal["bf16", "minifloat", "hifloat8"]
"""The rounding routines a kernel has: bfloat16's bit rounding, a minifloat grid's binades, HiFloat8's."""


@dataclass(frozen=True)
class GridRule:
    """An element grid as a kernel rounds onto it: which routine (``kind``) and its constants, all
    a kernel may know of the grid (``kernels.constants.grid``)."""

    kind: GridKind
    mbits: int = 0
    min_exponent: int = 0  # of the smallest normal binade (minifloat)
    max_exponent: int = 0  # of the largest finite value (minifloat)
    max_value: float = 0.0
    has_inf: bool = True
    signed_zero: bool = True


BF16_RULE = GridRule("bf16")  # bfloat16 is float32 with its low 16 bits rounded off: no grid constants


class ElementGrid(ABC):
    """Representable values of one element format (unscaled)."""

    name: str
    bits: int
    max_value: float
    min_positive: float
    has_inf: bool
    ties: Literal["even", "away"]
    signed_zero: bool

    @abstractmethod
    def spacing_field(self, exponent_field: Tensor) -> Tensor:
        """Exponent field of the grid spacing 2**q at the binade of float32 ``exponent_field``
        (which it may overwrite).

        Must keep q within [-126, 126] so that 2**q and 2**-q are normal float32 numbers.
        """

    @abstractmethod
    def code_values(self) -> list[tuple[int, float]]:
        """Every code of the format with its value (NaN codes included), by code."""

    @property
    @abstractmethod
    def rule(self) -> GridRule:
        """The grid as a kernel rounds onto it."""

    def round(self, x: Tensor, rounding: Rounding = "nearest", overflow: Overflow = "saturate",
              uniform: Tensor | None = None) -> Tensor:
        """Round float32 x onto the grid (a new tensor); ``uniform``: U[0,1) noise of x's
        shape for stochastic rounding, which it overwrites."""
        return self.round_(x.clone(), x, rounding, overflow, uniform)

    def round_(self, x: Tensor, signs: Tensor, rounding: Rounding = "nearest", overflow: Overflow = "saturate",
               uniform: Tensor | None = None) -> Tensor:
        """Round float32 x onto the grid in place (x must be the caller's temporary).

        ``signs``: any tensor of x's shape with x's signs (e.g. the unscaled input), used
        where the rounding rule works on magnitudes. One int32 temporary is allocated.
        """
        field = self.spacing_field(bits.exponent_field(x))  # of 2**q
        field.neg_().add_(_NEGATE_FIELD)  # now of 2**-q
        x.mul_(field.view(torch.float32))  # exact
        if rounding == "nearest" and self.ties == "even":
            round_half_even_(x)  # symmetric: keeps the sign (and -0)
        else:  # rules on magnitudes
            if is_stochastic(rounding):
                round_stochastic_(x.abs_(), uniform, DRAW_BITS[rounding])
            else:
                round_half_away_(x.abs_())
            x.copysign_(signs)
        x.mul_(field.neg_().add_(_NEGATE_FIELD).view(torch.float32))  # back to 2**q; exact
        self._apply_overflow_(x, overflow)
        if not self.signed_zero:
            x.masked_fill_(x == 0, 0.0)  # not "+ 0.0": compilers may drop that as a no-op
        return x

    def _apply_overflow_(self, y: Tensor, overflow: Overflow) -> None:
        if overflow == "saturate":  # Inf saturates too (like NVIDIA's SATFINITE); NaN stays
            y.clamp_(-self.max_value, self.max_value)
        else:  # beyond max: +-Inf, or NaN where the format has no Inf
            beyond = math.inf if self.has_inf else math.nan
            y.masked_fill_(y > self.max_value, beyond).masked_fill_(y < -self.max_value, -beyond)


@dataclass(frozen=True)
class Minifloat(ElementGrid):
    """IEEE-like binary float: sign, ``ebits`` exponent bits with ``bias``, ``mbits`` mantissa bits.

    ``special`` says what the all-ones exponent means: "ieee" (Inf and NaNs, e.g. E5M2,
    FP16), "fn" (finite only; all-ones exponent and mantissa is NaN, e.g. OCP E4M3) or
    "finite" (no Inf, no NaN: FP6, FP4).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    special: Literal["ieee", "fn", "finite"]

    ties = "even"
    signed_zero = True

    def __post_init__(self):
        spacing_exponents = (self.min_exponent - self.mbits, self.max_exponent - self.mbits)
        if not -126 <= min(spacing_exponents) <= max(spacing_exponents) <= 126:
            raise ValueError(f"{self.name}: range too wide for the float32 rounding routine")

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:
        """Exponent of the largest finite value."""
        top_field = (1 << self.ebits) - 1 - (self.special == "ieee")
        return top_field - self.bias

    @property
    def max_value(self) -> float:
        mantissa_codes = (1 << self.mbits) - (self.special == "fn")  # fn: top code is NaN
        return (1 + (mantissa_codes - 1) / (1 << self.mbits)) * 2.0 ** self.max_exponent

    @property
    def min_positive(self) -> float:
        return 2.0 ** (self.min_exponent - self.mbits)

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    def spacing_field(self, exponent_field: Tensor) -> Tensor:
        clamped = exponent_field.clamp_(bits.field_of(self.min_exponent), bits.field_of(self.max_exponent))
        return clamped.sub_(self.mbits << bits.MANTISSA_BITS)

    def decode(self, code: int) -> float:
        """Value of one code (Python floats; independent of the tensor routine)."""
        sign = -1.0 if code >> (self.ebits + self.mbits) & 1 else 1.0
        exponent_code = code >> self.mbits & ((1 << self.ebits) - 1)
        mantissa_code = code & ((1 << self.mbits) - 1)
        top_exponent = exponent_code == (1 << self.ebits) - 1
        if self.special == "ieee" and top_exponent:
            return sign * math.inf if mantissa_code == 0 else math.nan
        if self.special == "fn" and top_exponent and mantissa_code == (1 << self.mbits) - 1:
            return math.nan
        if exponent_code == 0:
            return sign * mantissa_code * self.min_positive
        return sign * (1 + mantissa_code / (1 << self.mbits)) * 2.0 ** (exponent_code - self.bias)

    def code_values(self) -> list[tuple[int, float]]:
        return [(code, self.decode(code)) for code in range(1 << self.bits)]

    @property
    def rule(self) -> GridRule:
        return GridRule("minifloat", self.mbits, self.min_exponent, self.max_exponent, self.max_value, self.has_inf,
                        self.signed_zero)


FP8_E4M3 = Minifloat("e4m3", ebits=4, mbits=3, bias=7, special="fn")
FP8_E5M2 = Minifloat("e5m2", ebits=5, mbits=2, bias=15, special="ieee")
FP6_E3M2 = Minifloat("e3m2", ebits=3, mbits=2, bias=3, special="finite")
FP6_E2M3 = Minifloat("e2m3", ebits=2, mbits=3, bias=1, special="finite")
FP4_E2M1 = Minifloat("e2m1", ebits=2, mbits=1, bias=1, special="finite")
FP16 = Minifloat("fp16", ebits=5, mbits=10, bias=15, special="ieee")
