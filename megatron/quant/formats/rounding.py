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

Rounding = Literal["nearest", "stochastic"]
"""The ``rounding`` option of every format. ``"nearest"``: to the nearest grid value, ties by the
element's rule (even for IEEE, OCP and NVFP4 grids, away from zero for HiFloat8); ``"stochastic"``:
down or up with probability equal to the distance to the other neighbour (noise: ``random_bits``)."""
ROUNDING_MODES: tuple[Rounding, ...] = get_args(Rounding)
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


def round_stochastic_(magnitude: Tensor, uniform: Tensor) -> Tensor:
    """Round magnitudes down or up with probability equal to the distance to the other
    neighbour. Overwrites ``magnitude`` and ``uniform``.

    ``uniform`` is U[0, 1) with 24-bit resolution (``random_bits``, or ``torch.rand``), so the expectation is
    exact whenever the fraction has at most 24 bits, which holds for every float32 value
    inside a format's normal range; deep in its subnormal range the bias is below 2**-24
    of one grid step. Inf stays Inf.
    """
    fraction = magnitude.frac()  # exact
    return magnitude.trunc_().add_(uniform.lt_(fraction))
