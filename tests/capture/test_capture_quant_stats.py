"""quant_stats against a brute-force count over megatron.quant.formats, and numpy error metrics."""
import math

import numpy as np
import pytest
import torch

from megatron.quant import formats
from megatron.quant.stats import pack_quant_stats, quant_stats, unpack_quant_stats


def brute_force_quant_stats(x: torch.Tensor, fmt, axis: int) -> dict:
    """Element by element over the format's own quantize_with_scale; error metrics in numpy
    over the elements finite in both x and q."""
    q, scale = fmt.quantize_with_scale(x, axis=axis)
    scale = scale.expand_as(x)
    xs, qs, ss = x.flatten().tolist(), q.flatten().tolist(), scale.flatten().tolist()
    overflow = sum(1 for v, s in zip(xs, ss) if abs(v) > fmt.max_value * s)
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


def operand_with_non_finite() -> torch.Tensor:
    x = operand_with_extremes()
    x[2, 7], x[3, 9], x[4, 0] = float("inf"), -float("inf"), float("nan")
    return x


@pytest.mark.parametrize("name", QUANTIZED_FORMATS)
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
def test_packed_route_equals_quant_stats(make):
    x, fmt = make(), formats.get_format("mxfp8")
    unpacked = unpack_quant_stats(pack_quant_stats(x, fmt).tolist(), x.numel())
    direct = quant_stats(x, fmt)
    assert unpacked == {key: pytest.approx(value, rel=1e-5) for key, value in direct.items()}


def test_given_quantized_value_and_scale_are_used_without_quantizing_again(monkeypatch):
    fmt = formats.get_format("mxfp8")
    x = operand_with_extremes()
    q, scale = fmt.quantize_with_scale(x)
    expected = quant_stats(x, fmt)
    monkeypatch.setattr(type(fmt), "quantize_with_scale", lambda *a, **k: pytest.fail("quantized again"))
    assert quant_stats(x, fmt, q=q, scale=scale) == expected
