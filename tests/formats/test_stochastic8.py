"""``rounding="stochastic8"``: stochastic rounding as Blackwell's ``cvt.rs`` draws it.

The rule, from the PTX ISA (``cvt``, the ``.rs`` modifier: the result is rounded away from zero on
the carry out of adding the random bits to the discarded mantissa bits; ``.e2m1x4`` takes 8 bits of
``rbits`` per element) and Transformer Engine's software fallback for GPUs without it
(``transformer_engine/common/util/ptx.cuh``, ``stochastic_round_fp4_e2m1``, TE PR #3281: 8 random
bits per element, ``r / 256`` of a grid step added before flooring): with ``f`` the remainder in
grid steps and ``r`` the element's 8-bit draw, round up iff ``floor(256 f) + r >= 256``. So the
round-up probability is ``floor(256 f) / 256`` and a remainder below 1/256 of a step never rounds up.
The oracle below is that formula on hand-picked cases, in exact integer arithmetic.
"""
import math

import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.formats.rounding import round_stochastic_


def _up(fraction: float, r: int) -> bool:
    """The hardware's carry, in integers: 8 random bits added to the top 8 discarded bits."""
    return math.floor(fraction * 256) + r >= 256


@pytest.mark.parametrize("fraction", [0.0, 2.0**-24, 1 / 512, 1 / 256 - 2.0**-20, 1 / 256, 0.3, 0.5,
                                      0.5 + 1 / 512, 255 / 256, 1 - 2.0**-20])
def test_every_draw_follows_the_carry_rule(fraction):
    draws = torch.arange(256, dtype=torch.float32)
    magnitude = torch.full((256,), 5.0 + fraction)  # 5 + f is exact in float32 for every case
    rounded = round_stochastic_(magnitude, draws / 256, bits=8)
    expected = torch.tensor([5.0 + _up(fraction, r) for r in range(256)])
    assert torch.equal(rounded, expected)
    # Up for exactly floor(256 f) of the 256 draws: probabilities come in steps of 1/256.
    assert int((rounded == 6).sum()) == math.floor(fraction * 256)


def test_a_remainder_below_one_256th_never_rounds_up_where_the_continuous_draw_does():
    fmt8 = get_format("fp8_e4m3", scaling="none", rounding="stochastic8")
    fmt = get_format("fp8_e4m3", scaling="none", rounding="stochastic")
    tiny = torch.full((1 << 14,), 1 + 2.0**-3 * 2.0**-9)  # 1/512 of a step (1/8 at 1) above 1
    noise = RandomBits.derive("tiny")
    assert torch.equal(fmt8.quantize(tiny, noise=noise), torch.ones(1 << 14))
    assert (fmt.quantize(tiny, noise=noise) > 1).any()  # the continuous draw: 1/512 of the time
    at_one_256th = torch.full((1 << 14,), 1 + 2.0**-3 * 2.0**-8)
    assert (fmt8.quantize(at_one_256th, noise=noise) > 1).any()


def test_the_8_bits_are_the_top_of_the_keyed_24_bit_draw():
    """Keyed as the continuous draw (``random_bits``: TP-, capture- and recompute-invariant): the
    element's 8 bits are the top 8 of its 24-bit draw."""
    noise = RandomBits.derive("key", 3)
    x = (torch.arange(4096, dtype=torch.float32) % 7 / 8 + 2).reshape(64, 64)  # remainders k/8 of a step
    u = noise.uniform((64, 64), "cpu")
    r = torch.floor(u * 256)
    expected = torch.floor(x) + (r + torch.floor(x.frac() * 256) >= 256).float()
    assert torch.equal(round_stochastic_(x.clone(), u.clone(), bits=8), expected)
    fmt = get_format("fp8_e4m3", scaling="none", rounding="stochastic8")
    # x / 8 + 1 lies in [1.25, 1.375): e4m3's step there is 1/8, so its remainders are x's.
    assert torch.equal(fmt.quantize(x / 8 + 1, noise=noise), expected / 8 + 1)


def test_bf16_takes_the_top_8_of_its_16_dropped_bits():
    one_plus = 1 + 2.0**-7 * (3 / 256 + 2.0**-12)  # 3/256 (and a bit) of a bf16 step above 1
    x = torch.full((1 << 14,), one_plus)
    q = get_format("bf16", rounding="stochastic8").quantize(x, noise=RandomBits.derive("bf16"))
    assert set(q.unique().tolist()) == {1.0, 1 + 2.0**-7}
    below = torch.full((1 << 14,), 1 + 2.0**-7 * 2.0**-9)
    assert torch.equal(get_format("bf16", rounding="stochastic8").quantize(below), torch.ones(1 << 14))


@pytest.mark.parametrize("name", ["nvfp4", "fp8_e4m3"])
def test_round_up_frequencies_are_floor_256f_over_256(name):
    """Fixed key, 2**16 draws per value: the binomial bound of 5.5 standard deviations fails by
    chance with probability below 1e-7 per value (and the key is fixed, so never in practice)."""
    options = {"scaling": "none"} if name == "fp8_e4m3" else {}
    fmt = get_format(name, rounding="stochastic8", **options)
    fractions = np.array([1 / 512, 1 / 256, 3 / 256 + 1 / 1024, 0.25, 0.5 + 1 / 512, 0.9])
    base, step = (2.0, 1.0) if name == "nvfp4" else (1.0, 0.125)  # e2m1 step in [2, 4); e4m3 in [1, 2)
    n = 1 << 16
    for k, fraction in enumerate(fractions):
        value = base + fraction * step
        row = torch.full((n // 16, 16), value, dtype=torch.float32)
        if name == "nvfp4":
            row[:, 0] = 6.0  # the block's amax at the element max: scales 1
        q = fmt.quantize(row, noise=RandomBits.derive("freq", name, k))
        values = q[:, 1:] if name == "nvfp4" else q  # NVFP4 decodes through 1 / 448 in float32: close to
        ups = int((values > value).sum())              # the grid values, not on them
        total = values.numel()
        assert torch.allclose(values, torch.where(values > value, base + step, base), rtol=1e-6)
        p = math.floor(fraction * 256) / 256
        bound = 5.5 * math.sqrt(total * p * (1 - p)) + 1e-9
        assert abs(ups - total * p) <= bound, (fraction, ups / total, p)
