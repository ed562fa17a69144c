"""quant_stats against a brute-force count over megatron.quant.formats, and numpy error metrics.

Overflow oracle, from what the format declares of its element grid (never its name): x / scale rounded
with numpy's frexp and round-half-even to a minifloat's mantissa bits (``mbits``) with an unbounded
exponent, beyond its ``max_value`` meaning overflow; HiFloat8's tapered grid cast with en_dtypes'
non-saturating hifloat8; a plain dtype cast with torch's own cast (beyond max: Inf). The minifloat
rule is checked against ml_dtypes' non-saturating casts where ml_dtypes has the grid.

The checks run over every registered format and over the one docs/extending.md adds with a new element
grid (E3M4), by the guide's own lines (``_extending_guide``).
"""
import math

import en_dtypes
import ml_dtypes
import numpy as np
import pytest
import torch
from _extending_guide import GUIDE_FORMAT, guide_format

from megatron.quant import formats
from megatron.quant.formats import grid
from megatron.quant.stats import pack_stats, quant_stats
from megatron.quant.stats import reference as stats_module


def rounds_beyond_max(a: np.ndarray, fmt) -> np.ndarray:
    """|x / scale| (float32) that the format's round-to-nearest takes beyond its max."""
    element = fmt.element
    if element is None:  # a plain cast: torch's, which goes to Inf beyond max
        return ~np.isfinite(torch.from_numpy(a).to(fmt.dtype).double().numpy())
    if element.rule.kind == "hifloat8":
        cast = a.astype(en_dtypes.hifloat8).astype(np.float64)
        return ~np.isfinite(cast) | (np.abs(cast) > fmt.max_value)
    return minifloat_rounds_beyond(a, element.mbits, fmt.max_value)


def minifloat_rounds_beyond(a: np.ndarray, mbits: int, max_value: float) -> np.ndarray:
    """|a| rounded to nearest-even on ``mbits`` mantissa bits, with an unbounded exponent, beyond max."""
    fraction, exponent = np.frexp(a.astype(np.float64))  # a = fraction * 2**exponent, fraction in [0.5, 1)
    rounded = np.round(fraction * 2.0 ** (mbits + 1)) * 2.0 ** (exponent - mbits - 1)  # ties to even
    return ~np.isfinite(rounded) | (rounded > max_value)


@pytest.mark.parametrize("element,dtype", [(grid.FP8_E4M3, ml_dtypes.float8_e4m3fn),
                                           (grid.FP8_E5M2, ml_dtypes.float8_e5m2), ("guide", ml_dtypes.float8_e3m4)])
def test_the_minifloat_oracle_is_ml_dtypes_non_saturating_cast(element, dtype, monkeypatch):
    if element == "guide":
        element = formats.get_format(guide_format(monkeypatch)).element
    top = float(ml_dtypes.finfo(dtype).max)
    assert element.max_value == top
    a = np.array(sorted({float(np.nextafter(np.float32(top * (1 + k / 64)), np.float32(d)))
                         for k in range(40) for d in (0, np.inf)}), dtype=np.float32)
    cast = a.astype(dtype).astype(np.float64)
    assert np.array_equal(minifloat_rounds_beyond(a, element.mbits, element.max_value),
                          ~np.isfinite(cast) | (cast > top))


def brute_force_overflow(x: torch.Tensor, scale: torch.Tensor, fmt) -> int:
    """Inf, plus finite x with a finite nonzero scale whose x / scale rounds beyond max."""
    xs = x.float().numpy().ravel()
    ss = scale.expand_as(x).float().numpy().ravel()
    usable = np.isfinite(xs) & np.isfinite(ss) & (ss != 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.abs(xs / ss).astype(np.float32)
    return int(np.isinf(xs).sum() + (usable & rounds_beyond_max(np.where(usable, ratio, 0), fmt)).sum())


def brute_force_quant_stats(x: torch.Tensor, fmt, axis: int) -> dict:
    """Element by element over the format's own quantize_with_scale; error metrics in numpy
    over the elements finite in both x and q."""
    q, scale = fmt.quantize_with_scale(x, axis=axis)
    overflow = brute_force_overflow(x, scale, fmt)
    scale = scale.expand_as(x)
    xs, qs = x.flatten().tolist(), q.flatten().tolist()
    underflow = sum(1 for v, w in zip(xs, qs) if v != 0 and w == 0)
    both = [(v, w) for v, w in zip(xs, qs) if math.isfinite(v) and math.isfinite(w)]
    xd, qd = (np.array(column, dtype=np.float64) for column in zip(*both))
    noise, signal = ((qd - xd) ** 2).sum(), (xd ** 2).sum()
    return {"overflow": overflow, "underflow": underflow, "rel_mse": noise / signal,
            "sqnr_db": 10 * math.log10(signal / noise) if noise else math.inf,
            "cosine": float(xd @ qd / math.sqrt(signal * (qd ** 2).sum()))}


def operand_with_extremes() -> torch.Tensor:
    torch.manual_seed(1)
    x = torch.randn(8, 64) * torch.logspace(-12, 6, 64)  # dynamic range beyond any 4/8-bit format
    x[0, :5] = 0.0
    x[1, 3] = 1e9
    return x


QUANTIZED_FORMATS = [name for name in formats.list_formats() if not formats.is_passthrough(name)]
CHECKED = [*QUANTIZED_FORMATS, GUIDE_FORMAT]


def operand_with_non_finite() -> torch.Tensor:
    x = operand_with_extremes()
    x[2, 7], x[3, 9], x[4, 0] = float("inf"), -float("inf"), float("nan")
    return x


@pytest.mark.parametrize("name", CHECKED, indirect=True)
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("make", [operand_with_extremes, operand_with_non_finite])
def test_quant_stats_match_brute_force(name, axis, make):
    fmt = formats.get_format(name)
    x = make()
    stats = quant_stats(x, fmt, axis=axis)
    ref = brute_force_quant_stats(x, fmt, axis)
    assert stats["overflow"] == ref["overflow"] and stats["underflow"] == ref["underflow"]
    assert stats["overflow_ratio"] == ref["overflow"] / x.numel()
    assert stats["underflow_ratio"] == ref["underflow"] / x.numel()
    assert stats["rel_mse"] == pytest.approx(ref["rel_mse"], rel=1e-5)
    assert stats["sqnr_db"] == pytest.approx(ref["sqnr_db"], rel=1e-5, abs=1e-4)  # dB: near 0 here
    assert stats["cosine"] == pytest.approx(ref["cosine"], rel=1e-5)


def test_the_extremes_trigger_underflow_and_unscaled_overflow():
    x = operand_with_extremes()
    per_format = {name: quant_stats(x, formats.get_format(name)) for name in QUANTIZED_FORMATS}
    assert all(s["underflow"] > 0 for s in per_format.values())
    unscaled = [n for n in QUANTIZED_FORMATS if formats.get_format(n).scaling == "none"]
    assert all(per_format[n]["overflow"] > 0 for n in unscaled)


def test_quant_stats_use_the_layers_quantized_value_when_given():
    fmt = formats.get_format(QUANTIZED_FORMATS[0])
    x = operand_with_extremes()
    stats = quant_stats(x, fmt, q=torch.zeros_like(x))
    assert stats["underflow"] == int((x != 0).sum()) and stats["cosine"] is None
    assert stats["rel_mse"] == pytest.approx(1.0)


def test_quant_stats_leave_the_formats_random_stream_alone():
    x = operand_with_extremes()
    untouched, measured = (formats.get_format("mxfp8", rounding="stochastic", seed=3) for _ in range(2))
    quant_stats(x, measured)
    assert torch.equal(measured.quantize(x), untouched.quantize(x))


@pytest.mark.parametrize("make", [operand_with_extremes, operand_with_non_finite])
@pytest.mark.parametrize("name,options,axis", [("mxfp8", {}, 0), ("nvfp4", {"block_shape": (16, 16)}, -1),
                                               ("fp8_e4m3", {}, -1)])
def test_packed_statistics_do_not_depend_on_the_tile_size(make, name, options, axis, monkeypatch):
    """Tiles are aligned subtrees of one summation tree: the torch path's tile size (like a kernel's
    program size) changes no bit of the sums, and no count."""
    x, fmt = make(), formats.get_format(name, **options)
    whole = pack_stats(x, fmt, axis)
    monkeypatch.setitem(stats_module._TILE_ELEMENTS, "cpu", 32)
    assert torch.equal(pack_stats(x, fmt, axis), whole)


def test_tiled_formats_block_statistics_see_whole_tiles():
    """A 16x16 tile is one block: its scale counts once in the histogram, its range spans the tile."""
    x = torch.ones(32, 32)
    x[0, 0] = 2.0 ** -6  # the tile's smallest value sits in another row than its largest
    x[5, 7] = 4.0
    stats = quant_stats(x, formats.get_format("nvfp4", block_shape=(16, 16)))
    assert sum(stats["block_scale_hist"]["counts"]) == 4
    assert stats["block_dynamic_range_log2_max"] == 8.0


def test_given_quantized_value_and_scale_are_used_without_quantizing_again(monkeypatch):
    fmt = formats.get_format("mxfp8")
    x = operand_with_extremes()
    q, scale = fmt.quantize_with_scale(x)
    expected = quant_stats(x, fmt)
    monkeypatch.setattr(type(fmt), "quantize_with_scale", lambda *a, **k: pytest.fail("quantized again"))
    assert quant_stats(x, fmt, q=q, scale=scale) == expected


def test_nvfp4_block_whose_scale_rounds_to_zero_is_underflow_only():
    x = torch.full((64,), 1e-3)
    x[0] = 1e6  # the tensor scale makes every other block's E4M3 scale round to zero
    fmt = formats.get_format("nvfp4")
    stats = quant_stats(x, fmt)
    assert (stats["overflow"], stats["underflow"]) == (0, 63)
    assert stats["overflow"] == brute_force_overflow(x, fmt.quantize_with_scale(x)[1], fmt)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "nvfp4", "fp8_e4m3"])
def test_inf_in_a_block_is_overflow(name):
    x = torch.linspace(-1, 1, 64)
    x[5], x[40] = float("inf"), -float("inf")
    fmt = formats.get_format(name)
    assert quant_stats(x, fmt)["overflow"] == 2 == brute_force_overflow(x, fmt.quantize_with_scale(x)[1], fmt)


def _around(value: float) -> list[float]:
    return [float(np.nextafter(np.float32(value), np.float32(d))) for d in (0, np.inf)] + [value]


@pytest.mark.parametrize("name", CHECKED, indirect=True)
def test_overflow_starts_at_the_rounding_boundary_above_max(name):
    """|x / scale| between max and the rounding boundary above it rounds down to max: in range."""
    fmt = formats.get_format(name)
    top = fmt.max_value
    x = torch.tensor(sorted({v for k in range(33) for v in _around(top * (1 + k / 64))}))
    scale = torch.ones(())
    overflow = quant_stats(x, fmt, q=x, scale=scale)["overflow"]
    assert overflow == brute_force_overflow(x, scale, fmt)
    assert 0 < overflow < int((x > top).sum())


def test_mx_block_values_that_round_down_to_max_are_in_range():
    x = torch.tensor([447.0, 448.0, 456.0, 463.0, 464.0, 465.0, 479.0, 480.0] * 4)  # scale 2**0
    stats = quant_stats(x, formats.get_format("mxfp8_e4m3", scale_mode="floor"))
    assert stats["overflow"] == 4 * 3  # 465, 479, 480; 464 is a tie that goes to even 448


def test_hadamard_overflow_is_counted_in_the_transformed_domain():
    """The scale of a transformed format belongs to the transformed values: data inside the
    range never overflows, and the statistics match those of quantizing the transformed x."""
    from megatron.quant.formats import get_format
    from megatron.quant.stats import quant_stats

    fmt, plain = get_format("nvfp4", hadamard=16), get_format("nvfp4")
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.01
    x[:, ::16] = 100.0  # one spike per group: the transform spreads it to 25 over 16 values
    stats = quant_stats(x, fmt, axis=-1)
    assert stats["overflow"] == 0
    assert stats["overflow"] == quant_stats(fmt.transform(x, -1), plain, axis=-1)["overflow"]
