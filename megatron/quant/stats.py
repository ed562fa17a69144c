"""Tensor statistics and format-aware quantization statistics (docs/interfaces.md section 3).

Each statistic is computed on the tensor's device into one packed float64 vector
(``pack_*``, no host sync) and turned into a dict of plain Python numbers by ``unpack_*``
after a single transfer. ``tensor_stats``/``quant_stats`` do both; the capture writer packs
on the device and unpacks in its background thread, so the training thread never syncs.

Conventions: min, max, mean, std and absmax are over the finite elements (NaN and Inf are
counted separately, so one NaN does not hide the rest); std is the population std (ddof=0);
undefined values (no finite element, zero norms) are None. Sums accumulate in float32 for
float32 and narrower inputs (torch reduces pairwise; relative error ~1e-6), float64 for float64.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from megatron.quant.formats import NumericFormat

# Histogram of log2|x|: bin k (1..60) holds 2**(LOW+k-1) <= |x| < 2**(LOW+k); bin 0 holds the
# nonzero finite values below 2**LOW, bin 61 those at or above 2**HIGH. Zeros are counted apart.
LOG2_LOW, LOG2_HIGH = -40, 20
LOG2_EDGES = list(range(LOG2_LOW, LOG2_HIGH + 1))
_N_BINS = len(LOG2_EDGES) + 1

# IEEE layouts read directly: (same-width int dtype, mantissa bits, exponent mask, bias).
# The exponent field of a normal value is floor(log2|x|) + bias: exact, and far cheaper than
# log2 or frexp. Narrower float types are widened to float32 first (exactly).
_LAYOUTS = {torch.float32: (torch.int32, 23, 0xFF, 127), torch.float64: (torch.int64, 52, 0x7FF, 1023)}
_TENSOR_SCALARS = 7  # n_finite, nans, nonzero, min, max, mean, variance; then exponent-field counts
_QUANT_KEYS = ("overflow", "overflow_ratio", "underflow", "underflow_ratio", "rel_mse", "sqnr_db", "cosine")


def _ieee_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _LAYOUTS else torch.float32


def _as_ieee(x: Tensor) -> Tensor:
    return x.to(_ieee_dtype(x.dtype))


def _stack_double(scalars: list[Tensor]) -> Tensor:
    # float64 holds counts exactly (float32 would not above 2**24), so one transfer carries all.
    return torch.stack([s.double() for s in scalars])


def _exponent_field_counts(v: Tensor) -> Tensor:
    """How many elements have each value of the IEEE exponent field (field 0: zeros, subnormals)."""
    int_dtype, mantissa_bits, mask, _ = _LAYOUTS[v.dtype]
    field = (v.contiguous().view(int_dtype) >> mantissa_bits) & mask
    return torch.bincount(field.flatten(), minlength=mask + 1)


def _log2_histogram(field_counts: Sequence[float], zeros: int, dtype: torch.dtype) -> list[int]:
    """Fold exponent-field counts into the fixed log2 bins (the top field, Inf/NaN, is left out)."""
    _, _, mask, bias = _LAYOUTS[dtype]
    first, last = bias + LOG2_LOW, bias + LOG2_HIGH  # fields of the binade bins: [first, last)
    counts = [int(c) for c in field_counts]
    below = counts[0] - zeros + sum(counts[1:first])  # subnormals are far below 2**LOG2_LOW too
    return [below, *counts[first:last], sum(counts[last:mask])]


def pack_tensor_stats(x: Tensor) -> Tensor:
    """The raw sums and counts behind ``tensor_stats``, on x's device, without a host sync."""
    v = _as_ieee(x.detach())
    if v.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=v.device)
    finite = torch.isfinite(v)
    n_finite = torch.count_nonzero(finite)
    count = n_finite.clamp(min=1)
    mean = torch.where(finite, v, 0.0).sum() / count
    centred = torch.where(finite, v - mean, 0.0)
    head = _stack_double([
        n_finite, torch.count_nonzero(torch.isnan(v)), torch.count_nonzero(v),
        torch.where(finite, v, math.inf).min(), torch.where(finite, v, -math.inf).max(),
        mean, (centred * centred).sum() / count,
    ])
    return torch.cat([head, _exponent_field_counts(v).double()])


def unpack_tensor_stats(packed: Sequence[float], shape: Sequence[int], dtype: torch.dtype) -> dict:
    """``tensor_stats``'s dict from ``pack_tensor_stats(x).tolist()`` and x's shape and dtype."""
    numel = math.prod(shape)
    result: dict = {"numel": numel, "shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
    if numel == 0:
        return {**result, "min": None, "max": None, "mean": None, "std": None, "absmax": None,
                "zeros": 0, "nans": 0, "infs": 0, "log2_hist": {"edges": LOG2_EDGES, "counts": [0] * _N_BINS}}
    n_finite, nans, nonzero, lo, hi, mean, var = packed[:_TENSOR_SCALARS]
    field_counts = packed[_TENSOR_SCALARS:]
    zeros, nans = numel - int(nonzero), int(nans)
    has_finite = n_finite > 0
    result.update(
        min=lo if has_finite else None, max=hi if has_finite else None, mean=mean if has_finite else None,
        std=math.sqrt(var) if has_finite else None, absmax=max(abs(lo), abs(hi)) if has_finite else None,
        zeros=zeros, nans=nans, infs=int(field_counts[-1]) - nans,
        log2_hist={"edges": LOG2_EDGES, "counts": _log2_histogram(field_counts, zeros, _ieee_dtype(dtype))},
    )
    return result


def tensor_stats(x: Tensor) -> dict:
    """numel, shape, dtype, min, max, mean, std, absmax, zeros, nans, infs, log2_hist."""
    return unpack_tensor_stats(pack_tensor_stats(x).tolist(), x.shape, x.dtype)


def pack_quant_stats(x: Tensor, fmt: "NumericFormat", axis: int = -1, amax: Optional[Tensor] = None,
                     q: Optional[Tensor] = None) -> Tensor:
    """The counts and sums behind ``quant_stats``, on x's device, without a host sync."""
    x = x.detach()
    if x.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    # A private generator: the statistics must not advance the format's own stochastic stream,
    # which the layers draw from (their results would change with capture on).
    generator = torch.Generator(device=x.device) if fmt.options.get("rounding") == "stochastic" else None
    fmt_q, scale = fmt.quantize_with_scale(x, axis=axis, amax=amax, generator=generator)
    v = _as_ieee(x)
    qv = (fmt_q if q is None else q).detach().to(v.dtype)
    both_finite = torch.isfinite(v) & torch.isfinite(qv)
    vf, qf = torch.where(both_finite, v, 0.0), torch.where(both_finite, qv, 0.0)
    error = qf - vf
    return _stack_double([
        torch.count_nonzero(v.abs() > scale.to(v.dtype) * fmt.max_value),
        torch.count_nonzero((v != 0) & (qv == 0)),
        (vf * vf).sum(), (error * error).sum(), (vf * qf).sum(), (qf * qf).sum(),
    ])


def unpack_quant_stats(packed: Sequence[float], numel: int) -> dict:
    """``quant_stats``'s dict from ``pack_quant_stats(...).tolist()`` and x's element count."""
    if numel == 0:
        return dict(zip(_QUANT_KEYS, (0, None, 0, None, None, None, None)))
    overflow, underflow, signal, noise, dot, q_power = packed
    if signal > 0:
        sqnr_db = 10 * math.log10(signal / noise) if noise > 0 else math.inf
    else:
        sqnr_db = None
    return {
        "overflow": int(overflow), "overflow_ratio": overflow / numel,
        "underflow": int(underflow), "underflow_ratio": underflow / numel,
        "rel_mse": noise / signal if signal > 0 else None,
        "sqnr_db": sqnr_db,
        "cosine": dot / math.sqrt(signal * q_power) if signal > 0 and q_power > 0 else None,
    }


def quant_stats(x: Tensor, fmt: "NumericFormat", axis: int = -1, amax: Optional[Tensor] = None,
                q: Optional[Tensor] = None) -> dict:
    """Overflow/underflow against ``fmt`` with its scaling, and the error of quantizing ``x``.

    overflow: |x| > fmt.max_value * scale (elements clipped at the format's max; Inf counts);
    underflow: x != 0 and q == 0. Both ratios are over all elements. ``q`` is the quantized
    value the layer used (e.g. stochastically rounded); by default the format's own result.
    rel_mse = sum((q-x)^2) / sum(x^2) and sqnr_db = 10 log10(sum(x^2) / sum((q-x)^2)) over the
    elements finite in both (sqnr_db is inf for an exact quantization); cosine of x and q.
    """
    return unpack_quant_stats(pack_quant_stats(x, fmt, axis, amax, q).tolist(), x.numel())
