"""Where a format saturates: the boundary of |x / scale| beyond which a value rounds past the
format's max (capture statistics count those elements as overflow; the kernels count them in the
pass that quantizes)."""
from __future__ import annotations

import functools
import math

import torch

from . import bits
from .interface import QuantFormat


@functools.lru_cache(maxsize=None)
def overflow_bound(fmt: QuantFormat) -> tuple[float, bool]:
    """(b, inclusive): |x / scale| is not representable without saturation (rounds beyond the
    format's max) iff it is above b, or equal to b when ``inclusive``.

    b lies half a grid step above max (the grid continued past max by its top binade's
    spacing); a value there is a tie, which rounds up unless ties go to even and max is the
    even neighbour (E4M3: 464 rounds to 448). Stochastic rounding is judged by this rule too.
    """
    element = fmt.element
    if element is None:  # a dtype cast: IEEE, ties to even
        finfo = torch.finfo(fmt.dtype)
        spacing, ties = float(finfo.eps) * 2.0 ** math.floor(math.log2(finfo.max)), "even"
    else:
        field = bits.exponent_field(torch.tensor([fmt.max_value], dtype=torch.float32))
        spacing, ties = element.spacing_field(field).view(torch.float32).item(), element.ties
    steps = round(fmt.max_value / spacing)  # max as a multiple of the spacing
    return fmt.max_value + spacing / 2, ties == "away" or steps % 2 == 1
