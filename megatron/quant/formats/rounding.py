"""Rounding rules on the integer grid (the noise for stochastic rounding: ``random_bits``).

Every format first scales a value so that its representable neighbours are consecutive
integers (``grid.ElementGrid.round``); the rules below then pick an integer. All of them
are exact in float32: no addition whose result could itself round. They work in place on
the caller's temporaries (on CPU every fresh full-size tensor costs page faults), and the
two non-IEEE rules take magnitudes (a >= 0, NaN or +Inf), the caller restoring the sign.
"""
from __future__ import annotations

from typing import Literal, get_args

from torch import Tensor

Rounding = Literal["nearest", "stochastic", "stochastic8"]
"""The ``rounding`` option of every format. ``"nearest"``: to the nearest grid value, ties by the
element's rule (even for IEEE, OCP and NVFP4 grids, away from zero for HiFloat8); ``"stochastic"``:
down or up with probability equal to the distance to the other neighbour (noise: ``random_bits``);
``"stochastic8"``: as Blackwell's ``cvt.rs`` draws it, 8 random bits per element, so the round-up
probability is the distance truncated to a multiple of 1/256 (``round_stochastic_``)."""
ROUNDING_MODES: tuple[Rounding, ...] = get_args(Rounding)
DRAW_BITS: dict[Rounding, int] = {"nearest": 0, "stochastic": 24, "stochastic8": 8}
"""Random bits each element draws: none, the continuous draw (``random_bits``' 24-bit U[0, 1),
compared with the exact fraction) or the hardware's 8 (the carry rule of ``round_stochastic_``)."""
CONTINUOUS_BITS = 24
_BELOW_HALF = 0.5 - 2.0**-25  # the largest float32 below 0.5


def round_half_even_(a: Tensor) -> Tensor:
    """Nearest integer, ties to even (IEEE's default; OCP FP8/MX, NVFP4). Overwrites a."""
    return a.round_()


def round_half_away_(magnitude: Tensor) -> Tensor:
    """Nearest integer, ties away from zero (HiFloat8), of magnitudes. Overwrites them.

    ``trunc(a + 0.5)`` is wrong for a = 0.5 - 2**-25: the sum rounds up to 1.0. Adding the
    float just below one half instead is exact enough everywhere: a tie N + 0.5 sums to
    N + 1 - 2**-25, which rounds to N + 1 (its binade's spacing is at least 2**-24, and
    for N = 0 the tie between 1 - 2**-24 and 1 goes to the even 1), while anything below
    a tie stays below N + 1. Inf stays Inf, NaN stays NaN.
    """
    return magnitude.add_(_BELOW_HALF).trunc_()


def is_stochastic(rounding: Rounding) -> bool:
    """Whether ``rounding`` draws random bits (either stochastic rule)."""
    return DRAW_BITS[rounding] > 0


def round_stochastic_(magnitude: Tensor, uniform: Tensor, bits: int = CONTINUOUS_BITS) -> Tensor:
    """Round magnitudes down or up at random. Overwrites ``magnitude`` and ``uniform``.

    ``uniform`` is U[0, 1) with 24-bit resolution (``random_bits``, or ``torch.rand``).

    The continuous draw (``bits`` 24) rounds up with probability equal to the distance to the lower
    neighbour: exact whenever the fraction has at most 24 bits, which holds for every float32 value
    inside a format's normal range; deep in its subnormal range the bias is below 2**-24 of one
    grid step.

    Fewer ``bits`` follow the hardware: PTX ISA, ``cvt`` (".rs: rounded toward zero or away from zero
    based on the carry out of the integer addition of the supplied random bits (rbits) to the
    truncated off (discarded) bits of mantissa"; ``.e2m1x4`` and ``.e4m3x4``/``.e5m2x4`` take 8 bits
    of ``rbits`` per element). The random bits align with the top of the discarded bits, so the
    carry is ``floor(2**bits * fraction) + r >= 2**bits`` with ``r`` the top ``bits`` of the draw:
    the round-up probability is ``floor(2**bits * fraction) / 2**bits``, in steps of 2**-bits, and
    a fraction below 2**-bits never rounds up. Transformer Engine's software fallback for GPUs
    without ``cvt.rs`` (``common/util/ptx.cuh``, ``stochastic_round_fp4_e2m1``, TE PR #3281) draws
    the same ``r / 256`` of a step and adds it to the magnitude in float32, which agrees except where
    that sum rounds (to even) onto the upper neighbour from half an ulp below it; the integer carry
    here is the instruction's. Everything here is exact in float32. Inf stays Inf.
    """
    fraction = magnitude.frac()  # exact
    if bits >= CONTINUOUS_BITS:
        return magnitude.trunc_().add_(uniform.lt_(fraction))
    steps = float(1 << bits)
    carry = uniform.mul_(steps).floor_().add_(fraction.mul_(steps).floor_()).ge_(steps)  # exact integers
    return magnitude.trunc_().add_(carry)
