"""Tensor statistics and format-aware quantization statistics (docs/interfaces.md section 3).

Everything is computed on the tensor's device and read back with one ``.tolist()`` of stacked
scalars (a second one only for tensors holding NaN or Inf). Results are plain Python numbers.

Conventions: min, max, mean, std and absmax are over the finite elements (NaN and Inf are
counted separately, so one NaN does not hide the rest); std is the population std (ddof=0);
undefined values (no finite element, zero norms) are None. Sums are float32 on float32 and
narrower inputs (torch's reductions are pairwise, relative error ~1e-6), float64 on float64.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

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
# The exponent field of a normal value is floor(log2|x|) + bias; reading it is exact and far
# cheaper than log2/frexp. Narrower float types are widened to float32 first (exactly).
_LAYOUTS = {torch.float32: (torch.int32, 23, 0xFF, 127), torch.float64: (torch.int64, 52, 0x7FF, 1023)}


def _dtype_name(x: Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _as_ieee(x: Tensor) -> Tensor:
    return x if x.dtype in _LAYOUTS else x.float()


def _exponent_field_counts(x: Tensor) -> Tensor:
    """How many elements have each value of the IEEE exponent field (field 0: zeros, subnormals)."""
    int_dtype, mantissa_bits, mask, _ = _LAYOUTS[x.dtype]
    field = (x.contiguous().view(int_dtype) >> mantissa_bits) & mask
    return torch.bincount(field.flatten(), minlength=mask + 1)


def _log2_histogram(field_counts: list[int], zeros: int, dtype: torch.dtype) -> list[int]:
    """Fold exponent-field counts into the fixed log2 bins (the top field, Inf/NaN, is left out)."""
    _, _, mask, bias = _LAYOUTS[dtype]
    counts = [0] * _N_BINS
    counts[0] = field_counts[0] - zeros  # subnormals: far below 2**LOG2_LOW for float32/64
    for field in range(1, mask):
        counts[min(max(field - bias - LOG2_LOW + 1, 0), _N_BINS - 1)] += field_counts[field]
    return counts


def _stack_double(scalars: list[Tensor]) -> Tensor:
    # float64 holds counts exactly (float32 would not above 2**24), so one transfer fits all.
    return torch.stack([s.double() for s in scalars])


def _moments(x: Tensor, count: Tensor) -> list[Tensor]:
    """min, max, mean, population variance of ``x`` (all elements), as 0-d tensors."""
    lo, hi = torch.aminmax(x)
    mean = x.sum() / count
    centred = x - mean
    return [lo, hi, mean, (centred * centred).sum() / count]


def tensor_stats(x: Tensor) -> dict:
    """numel, shape, dtype, min, max, mean, std, absmax, zeros, nans, infs, log2_hist."""
    x = x.detach()
    numel = x.numel()
    result: dict = {"numel": numel, "shape": list(x.shape), "dtype": _dtype_name(x)}
    if numel == 0:
        return {**result, "min": None, "max": None, "mean": None, "std": None, "absmax": None,
                "zeros": 0, "nans": 0, "infs": 0, "log2_hist": {"edges": LOG2_EDGES, "counts": [0] * _N_BINS}}
    v = _as_ieee(x)
    field_counts = _exponent_field_counts(v)
    head = _stack_double([torch.count_nonzero(v), *_moments(v, numel)])
    values = torch.cat([head, field_counts.double()]).tolist()
    nonzero, lo, hi, mean, var = values[:5]
    field_counts = [int(c) for c in values[5:]]
    zeros, non_finite = numel - int(nonzero), field_counts[-1]
    nans = infs = 0
    if non_finite:  # rare: recompute over the finite elements only (the one extra host sync)
        finite = torch.isfinite(v)
        n_finite = finite.sum()
        kept = torch.where(finite, v, 0.0)
        mean_t = kept.sum() / n_finite.clamp(min=1)
        centred = torch.where(finite, v - mean_t, 0.0)
        n_fin, nans, lo, hi, mean, var = _stack_double([
            n_finite, torch.isnan(v).sum(),
            torch.where(finite, v, math.inf).min(), torch.where(finite, v, -math.inf).max(),
            mean_t, (centred * centred).sum() / n_finite.clamp(min=1)]).tolist()
        nans = int(nans)
        infs = non_finite - nans
        if n_fin == 0:
            lo = hi = mean = var = None
    result.update(
        min=lo, max=hi, mean=mean, std=None if var is None else math.sqrt(var),
        absmax=None if lo is None else max(abs(lo), abs(hi)),
        zeros=zeros, nans=nans, infs=infs,
        log2_hist={"edges": LOG2_EDGES, "counts": _log2_histogram(field_counts, zeros, v.dtype)},
    )
    return result


def _error_sums(x: Tensor, q: Tensor) -> list[Tensor]:
    """sum x^2, sum (q-x)^2, sum x*q, sum q^2."""
    error = q - x
    return [(x * x).sum(), (error * error).sum(), (x * q).sum(), (q * q).sum()]


def quant_stats(x: Tensor, fmt: "NumericFormat", axis: int = -1, amax: Optional[Tensor] = None,
                q: Optional[Tensor] = None) -> dict:
    """Overflow/underflow against ``fmt`` with its scaling, and the error of quantizing ``x``.

    overflow: |x| > fmt.max_value * scale (elements clipped at the format's max; Inf counts);
    underflow: x != 0 and q == 0. Both ratios are over all elements. ``q`` is the quantized
    value the layer used (e.g. stochastically rounded); by default the format's own result.
    rel_mse = sum((q-x)^2) / sum(x^2) and sqnr_db = 10 log10(sum(x^2) / sum((q-x)^2)) over the
    elements finite in both (sqnr_db is inf for an exact quantization); cosine of x and q.
    """
    x = x.detach()
    numel = x.numel()
    if numel == 0:
        return {"overflow": 0, "overflow_ratio": None, "underflow": 0, "underflow_ratio": None,
                "rel_mse": None, "sqnr_db": None, "cosine": None}
    fmt_q, scale = fmt.quantize_with_scale(x, axis=axis, amax=amax)
    v = _as_ieee(x)
    qv = (fmt_q if q is None else q).detach().to(v.dtype)
    overflow = torch.count_nonzero(v.abs() > scale.to(v.dtype) * fmt.max_value)
    underflow = torch.count_nonzero((v != 0) & (qv == 0))
    overflow, underflow, signal, noise, dot, q_power = _stack_double([overflow, underflow,
                                                                      *_error_sums(v, qv)]).tolist()
    if not math.isfinite(signal + noise + dot + q_power):  # rare: keep elements finite in both
        finite = torch.isfinite(v) & torch.isfinite(qv)
        signal, noise, dot, q_power = _stack_double(
            _error_sums(torch.where(finite, v, 0.0), torch.where(finite, qv, 0.0))).tolist()
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
