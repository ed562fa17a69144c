"""Tensor statistics and format-aware quantization statistics (docs/interfaces.md section 3).

Statistics are computed on the tensor's device into one packed float64 vector and turned
into a dict of plain Python numbers after a single transfer. ``tensor_stats``/``quant_stats``
take the fast route (all elements) and redo the sums over the finite elements only when the
first transfer shows NaN or Inf. ``pack_*`` always mask (no host sync at all) and ``unpack_*``
read their transfer: the capture path uses them for GPU tensors so that the training thread
never waits for the device.

Conventions: min, max, mean, std and absmax are over the finite elements (NaN and Inf are
counted separately, so one NaN does not hide the rest); std is the population std (ddof=0);
undefined values (no finite element, zero norms) are None. Sums accumulate in float32 for
float32 and narrower inputs (torch reduces pairwise; relative error ~1e-6), float64 for float64.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from torch import Tensor

from megatron.quant.formats import bits

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


def _packed_tensor_stats(v: Tensor, finite_only: bool) -> Tensor:
    """[n_finite, nans, nonzero, min, max, mean, variance, exponent-field counts...] of IEEE ``v``.

    Without ``finite_only``, every element is assumed finite (n_finite = numel, nans = 0); the
    result is only valid when the top exponent field (Inf/NaN) count is 0.
    """
    if finite_only:
        finite = torch.isfinite(v)
        n_finite = torch.count_nonzero(finite)
        count = n_finite.clamp(min=1)
        mean = torch.where(finite, v, 0.0).sum() / count
        centred = torch.where(finite, v - mean, 0.0)
        head = [n_finite, torch.count_nonzero(torch.isnan(v)), torch.count_nonzero(v),
                torch.where(finite, v, math.inf).min(), torch.where(finite, v, -math.inf).max(),
                mean, (centred * centred).sum() / count]
    else:
        count = v.numel()
        mean = v.sum() / count
        lo, hi = torch.aminmax(v)
        head = [v.new_tensor(count), v.new_tensor(0), torch.count_nonzero(v), lo, hi, mean,
                torch.dist(v, mean) ** 2 / count]
    return torch.cat([_stack_double(head), _exponent_field_counts(v).double()])


def pack_tensor_stats(x: Tensor) -> Tensor:
    """The sums and counts behind ``tensor_stats``, on x's device, without a host sync."""
    v = _as_ieee(x.detach())
    if v.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=v.device)
    return _packed_tensor_stats(v, finite_only=True)


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
    v = _as_ieee(x.detach())
    if v.numel() == 0:
        return unpack_tensor_stats([], x.shape, x.dtype)
    packed = _packed_tensor_stats(v, finite_only=False).tolist()
    if packed[-1]:  # Inf or NaN present: the sums above are void
        packed = _packed_tensor_stats(v, finite_only=True).tolist()
    return unpack_tensor_stats(packed, x.shape, x.dtype)


def _merge_packed_tensor_stats(first: Sequence[float], second: Sequence[float]) -> list[float]:
    """Packed statistics of two parts combined (Chan et al.'s pairwise update of mean and
    variance: exact even when |mean| >> std)."""
    n1, n2 = first[0], second[0]
    n = n1 + n2
    delta = second[5] - first[5]
    mean = first[5] + delta * n2 / n if n else 0.0
    variance = (first[6] * n1 + second[6] * n2 + delta * delta * n1 * n2 / n) / n if n else 0.0
    return [n, first[1] + second[1], first[2] + second[2], min(first[3], second[3]), max(first[4], second[4]),
            mean, variance, *(a + b for a, b in zip(first[_TENSOR_SCALARS:], second[_TENSOR_SCALARS:]))]


def tensor_stats_float64(x: Tensor, chunk: int = 1 << 22) -> dict:
    """``tensor_stats`` with float64 sums, over ``chunk`` elements at a time: for tensors read
    from files (memory-mapped), where exactness matters more than speed and memory must stay
    bounded whatever the size."""
    if x.numel() == 0:
        return unpack_tensor_stats([], x.shape, x.dtype)
    packed = functools.reduce(_merge_packed_tensor_stats,
                              (_packed_tensor_stats(part.double(), finite_only=True).tolist()
                               for part in x.detach().reshape(-1).split(chunk)))
    return {**unpack_tensor_stats(packed, x.shape, torch.float64), "dtype": str(x.dtype).removeprefix("torch.")}


@functools.lru_cache(maxsize=None)
def overflow_bound(fmt: "NumericFormat") -> tuple[float, bool]:
    """(b, inclusive): |x / scale| is not representable without saturation (rounds beyond the
    format's max) iff it is above b, or equal to b when ``inclusive``.

    b lies half a grid step above max (the grid continued past max by its top binade's
    spacing); a value there is a tie, which rounds up unless ties go to even and max is the
    even neighbour (E4M3: 464 rounds to 448). Stochastic rounding is judged by this rule too.
    """
    element = getattr(fmt, "element", None)
    if element is None:  # a dtype cast: IEEE, ties to even
        finfo = torch.finfo(fmt.dtype)
        spacing, ties = float(finfo.eps) * 2.0 ** math.floor(math.log2(finfo.max)), "even"
    else:
        field = bits.exponent_field(torch.tensor([fmt.max_value], dtype=torch.float32))
        spacing, ties = element.spacing_field(field).view(torch.float32).item(), element.ties
    steps = round(fmt.max_value / spacing)  # max as a multiple of the spacing
    return fmt.max_value + spacing / 2, ties == "away" or steps % 2 == 1


def _overflow_count(v: Tensor, scale: Tensor, fmt: "NumericFormat") -> Tensor:
    """Elements not representable without saturation: Inf, and finite x whose x / scale (the
    division the format does) rounds beyond max. A zero scale (an NVFP4 block whose E4M3
    scale underflowed) quantizes its block to zero: underflow, not overflow; a NaN scale (a
    block holding Inf or NaN) makes its finite elements NaN, neither."""
    bound, inclusive = overflow_bound(fmt)
    ratio = v.abs() / scale
    beyond = ratio >= bound if inclusive else ratio > bound
    return torch.count_nonzero((beyond & (scale != 0)) | torch.isinf(v))


def _packed_quant_stats(v: Tensor, qv: Tensor, scale: Tensor, fmt: "NumericFormat", finite_only: bool) -> Tensor:
    """[overflow, underflow, sum x^2, sum (q-x)^2, sum x*q, sum q^2]; sums over elements finite
    in both when ``finite_only`` (else over all: void if any is not finite)."""
    overflow = _overflow_count(v, scale, fmt)
    underflow = torch.count_nonzero((qv == 0) & (v != 0))
    if finite_only:
        both_finite = torch.isfinite(v) & torch.isfinite(qv)
        v, qv = torch.where(both_finite, v, 0.0), torch.where(both_finite, qv, 0.0)
    return _stack_double([overflow, underflow, torch.linalg.vector_norm(v) ** 2, torch.dist(qv, v) ** 2,
                          (v * qv).sum(), torch.linalg.vector_norm(qv) ** 2])


def quantize_aside(x: Tensor, fmt: "NumericFormat", axis: int = -1, amax: Optional[Tensor] = None
                   ) -> tuple[Tensor, Tensor]:
    """``fmt.quantize_with_scale`` for observing x only: stochastic rounding draws from a private
    generator, so the format's own stream, which the layers use, is not advanced (their
    results would otherwise change with capture on)."""
    generator = torch.Generator(device=x.device) if fmt.options.get("rounding") == "stochastic" else None
    return fmt.quantize_with_scale(x.detach(), axis=axis, amax=amax, generator=generator)


def _quantized_operands(x: Tensor, fmt: "NumericFormat", axis: int, amax: Optional[Tensor],
                        q: Optional[Tensor], scale: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """x, q and the scale in x's IEEE dtype; quantizes only when q or scale is missing."""
    if q is None or scale is None:
        fmt_q, fmt_scale = quantize_aside(x, fmt, axis, amax)
        q = fmt_q if q is None else q
        scale = fmt_scale if scale is None else scale
    v = _as_ieee(x)
    return v, q.detach().to(v.dtype), scale.detach().to(v.dtype)


def pack_quant_stats(x: Tensor, fmt: "NumericFormat", axis: int = -1, amax: Optional[Tensor] = None,
                     q: Optional[Tensor] = None, scale: Optional[Tensor] = None) -> Tensor:
    """The counts and sums behind ``quant_stats``, on x's device, without a host sync."""
    x = x.detach()
    if x.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    v, qv, scale = _quantized_operands(x, fmt, axis, amax, q, scale)
    return _packed_quant_stats(v, qv, scale, fmt, finite_only=True)


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
                q: Optional[Tensor] = None, scale: Optional[Tensor] = None) -> dict:
    """Overflow/underflow against ``fmt`` with its scaling, and the error of quantizing ``x``.

    overflow: elements not representable without saturation (``overflow_bound``: |x / scale|
    rounds beyond the format's max; Inf counts, and Inf in a block counts as for per-tensor
    scaling); underflow: x != 0 and q == 0 (an NVFP4 block whose scale rounds to zero is
    underflow only). Both ratios are over all elements. ``q`` is the quantized
    value the layer used (e.g. stochastically rounded); by default the format's own result.
    ``scale`` is the one ``fmt.quantize_with_scale`` returned with it; given both, x is not
    quantized again. rel_mse = sum((q-x)^2) / sum(x^2) and sqnr_db = 10 log10(sum(x^2) / sum((q-x)^2)) over the
    elements finite in both (sqnr_db is inf for an exact quantization); cosine of x and q.
    """
    x = x.detach()
    if x.numel() == 0:
        return unpack_quant_stats([], 0)
    v, qv, scale = _quantized_operands(x, fmt, axis, amax, q, scale)
    packed = _packed_quant_stats(v, qv, scale, fmt, finite_only=False).tolist()
    if not math.isfinite(sum(packed[2:])):  # Inf or NaN present: redo the sums over finite elements
        packed = _packed_quant_stats(v, qv, scale, fmt, finite_only=True).tolist()
    return unpack_quant_stats(packed, x.numel())
