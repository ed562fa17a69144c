"""Tensor statistics and format-aware quantization statistics (docs/interfaces.md section 3).

Everything is computed on the tensor's device; each function makes one host transfer (the
scalars are stacked and read with a single ``.tolist()``). Results are plain Python numbers.

Conventions: min, max, mean, std and absmax are over the finite elements (NaN and Inf are
counted separately, so one NaN does not hide the rest); std is the population std (ddof=0);
values that are undefined (no finite element, zero norms) are None.
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


def _dtype_name(x: Tensor) -> str:
    return str(x.dtype).removeprefix("torch.")


def _log2_bin_counts(values: Tensor, counted: Tensor) -> Tensor:
    # frexp gives |x| = m * 2**e with m in [0.5, 1), so floor(log2|x|) = e - 1 exactly
    # (torch.log2 can round a value just below a power of two up into the next binade).
    _, exponent = torch.frexp(values.abs())
    bins = (exponent.long() - 1 - LOG2_LOW + 1).clamp_(0, _N_BINS - 1)
    # Elements not counted go to an extra bin that is dropped: masking would sync the host.
    bins = torch.where(counted, bins, _N_BINS)
    return torch.bincount(bins.flatten(), minlength=_N_BINS + 1)[:_N_BINS]


def tensor_stats(x: Tensor) -> dict:
    """numel, shape, dtype, min, max, mean, std, absmax, zeros, nans, infs, log2_hist."""
    x = x.detach()
    numel = x.numel()
    result: dict = {"numel": numel, "shape": list(x.shape), "dtype": _dtype_name(x)}
    if numel == 0:
        return {**result, "min": None, "max": None, "mean": None, "std": None, "absmax": None,
                "zeros": 0, "nans": 0, "infs": 0,
                "log2_hist": {"edges": LOG2_EDGES, "counts": [0] * _N_BINS}}
    xf = x.float()
    finite = torch.isfinite(xf)
    finite_values = torch.where(finite, xf, 0.0).double()
    n_finite = finite.sum()
    mean = finite_values.sum() / n_finite.clamp(min=1)
    centred = torch.where(finite, finite_values - mean, 0.0)
    scalars = torch.stack([
        n_finite.double(),
        torch.isnan(xf).sum().double(),
        torch.isinf(xf).sum().double(),
        (xf == 0).sum().double(),
        torch.where(finite, xf, math.inf).min().double(),
        torch.where(finite, xf, -math.inf).max().double(),
        mean,
        (centred * centred).sum() / n_finite.clamp(min=1),
    ])
    counts = _log2_bin_counts(xf, finite & (xf != 0))
    values = torch.cat([scalars, counts.double()]).tolist()
    n_fin, nans, infs, zeros, lo, hi, mean_v, var = values[:8]
    has_finite = n_fin > 0
    result.update(
        min=lo if has_finite else None,
        max=hi if has_finite else None,
        mean=mean_v if has_finite else None,
        std=math.sqrt(var) if has_finite else None,
        absmax=max(abs(lo), abs(hi)) if has_finite else None,
        zeros=int(zeros), nans=int(nans), infs=int(infs),
        log2_hist={"edges": LOG2_EDGES, "counts": [int(c) for c in values[8:]]},
    )
    return result


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
    q = (fmt_q if q is None else q).detach()
    xf, qf = x.float(), q.float()
    both_finite = torch.isfinite(xf) & torch.isfinite(qf)
    xd = torch.where(both_finite, xf, 0.0).double()
    qd = torch.where(both_finite, qf, 0.0).double()
    error = qd - xd
    overflow, underflow, signal, noise, dot, q_power = torch.stack([
        (xf.abs() > fmt.max_value * scale).sum().double(),
        ((xf != 0) & (qf == 0)).sum().double(),
        (xd * xd).sum(),
        (error * error).sum(),
        (xd * qd).sum(),
        (qd * qd).sum(),
    ]).tolist()
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
