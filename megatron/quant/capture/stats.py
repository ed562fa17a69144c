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

from megatron.quant.formats.base import abs_max, normalize_axis
from megatron.quant.formats.blocks import split_blocks
from megatron.quant.formats.saturation import overflow_bound

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
_TENSOR_SCALARS = 8  # n_finite, nans, nonzero, min, max, mean, variance, min nonzero |x|; then exponent-field counts
_QUANT_KEYS = ("overflow", "overflow_ratio", "underflow", "underflow_ratio", "rel_mse", "sqnr_db", "cosine", "mse")
_QUANT_SCALARS = 7  # overflow, underflow, sum x^2, sum (q-x)^2, sum x*q, sum q^2, elements summed
_BLOCK_KEYS = ("block_dynamic_range_log2_max", "block_scale_min", "block_scale_max", "block_scale_spread_log2",
               "block_scale_hist")


def _ieee_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _LAYOUTS else torch.float32


def _as_ieee(x: Tensor) -> Tensor:
    return x.to(_ieee_dtype(x.dtype))


def _stack_double(scalars: list[Tensor]) -> Tensor:
    # float64 holds counts exactly (float32 would not above 2**24), so one transfer carries all.
    return torch.stack([s.double() for s in scalars])


def _exponent_field_counts(v: Tensor, where: Optional[Tensor] = None) -> Tensor:
    """How many elements (of those ``where`` is True) have each value of the IEEE exponent
    field (field 0: zeros, subnormals), as float64."""
    int_dtype, mantissa_bits, mask, _ = _LAYOUTS[v.dtype]
    field = (v.contiguous().view(int_dtype) >> mantissa_bits) & mask
    weights = None if where is None else where.flatten().double()
    return torch.bincount(field.flatten(), weights, minlength=mask + 1).double()


def _log2_histogram(field_counts: Sequence[float], zeros: int, dtype: torch.dtype) -> list[int]:
    """Fold exponent-field counts into the fixed log2 bins (the top field, Inf/NaN, is left out)."""
    _, _, mask, bias = _LAYOUTS[dtype]
    first, last = bias + LOG2_LOW, bias + LOG2_HIGH  # fields of the binade bins: [first, last)
    counts = [int(c) for c in field_counts]
    below = counts[0] - zeros + sum(counts[1:first])  # subnormals are far below 2**LOG2_LOW too
    return [below, *counts[first:last], sum(counts[last:mask])]


def _min_nonzero_abs(v: Tensor, dim: Optional[int] = None) -> Tensor:
    """min |x| over the nonzero elements (Inf where there is none)."""
    magnitude = v.abs()
    magnitude = torch.where(magnitude == 0, math.inf, magnitude)
    return magnitude.amin() if dim is None else magnitude.amin(dim)


def _log2_ratio(high: float, low: float) -> Optional[float]:
    """log2(high / low) for 0 < low <= high < Inf, else None (in float64: the ratio of two
    float32 extremes may exceed float32's range)."""
    if not (0 < low <= high < math.inf):
        return None
    return math.log2(high) - math.log2(low)


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
                mean, (centred * centred).sum() / count, _min_nonzero_abs(torch.where(finite, v, 0.0))]
    else:
        count = v.numel()
        mean = v.sum() / count
        lo, hi = torch.aminmax(v)
        head = [v.new_tensor(count), v.new_tensor(0), torch.count_nonzero(v), lo, hi, mean,
                torch.dist(v, mean) ** 2 / count, _min_nonzero_abs(v)]
    return torch.cat([_stack_double(head), _exponent_field_counts(v)])


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
                "dynamic_range_log2": None,
                "zeros": 0, "nans": 0, "infs": 0, "log2_hist": {"edges": LOG2_EDGES, "counts": [0] * _N_BINS}}
    n_finite, nans, nonzero, lo, hi, mean, var, min_nonzero = packed[:_TENSOR_SCALARS]
    field_counts = packed[_TENSOR_SCALARS:]
    zeros, nans = numel - int(nonzero), int(nans)
    has_finite = n_finite > 0
    result.update(
        min=lo if has_finite else None, max=hi if has_finite else None, mean=mean if has_finite else None,
        std=math.sqrt(var) if has_finite else None, absmax=max(abs(lo), abs(hi)) if has_finite else None,
        dynamic_range_log2=_log2_ratio(max(abs(lo), abs(hi)), min_nonzero) if has_finite else None,
        zeros=zeros, nans=nans, infs=int(field_counts[-1]) - nans,
        log2_hist={"edges": LOG2_EDGES, "counts": _log2_histogram(field_counts, zeros, _ieee_dtype(dtype))},
    )
    return result


def tensor_stats(x: Tensor) -> dict:
    """numel, shape, dtype, min, max, mean, std, absmax, dynamic_range_log2 (log2 of absmax over the
    smallest nonzero finite |x|), zeros, nans, infs, log2_hist."""
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
            mean, variance, min(first[7], second[7]), *(a + b for a, b in zip(first[_TENSOR_SCALARS:], second[_TENSOR_SCALARS:]))]


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


def _overflow_count(v: Tensor, scale: Tensor, fmt: "NumericFormat") -> Tensor:
    """Elements not representable without saturation: Inf, and finite x whose x / scale (the
    division the format does) rounds beyond max. A zero scale (an NVFP4 block whose E4M3
    scale underflowed) quantizes its block to zero: underflow, not overflow; a NaN scale (a
    block holding Inf or NaN) makes its finite elements NaN, neither."""
    return torch.count_nonzero((_beyond(v.abs() / scale, fmt) & (scale != 0)) | torch.isinf(v))


def _beyond(ratio: Tensor, fmt: "NumericFormat") -> Tensor:
    """|x / scale| values that round beyond the format's max (``overflow_bound``)."""
    bound, inclusive = overflow_bound(fmt)
    return ratio >= bound if inclusive else ratio > bound


def _finite_overflow_count(v: Tensor, scale: Tensor, fmt: "NumericFormat", axis: int, absmax: float) -> int:
    """``_overflow_count`` of an all-finite v, element by element only where it can be nonzero:
    division is monotonic, so nothing overflows unless absmax / scale does (per tensor, or
    per block for block formats: then only the blocks whose absmax overflows are counted)."""
    if scale.numel() == 1:
        return 0 if not _beyond(v.new_tensor(absmax) / scale, fmt) else int(_overflow_count(v, scale, fmt))
    if fmt.block_size is None:
        return int(_overflow_count(v, scale, fmt))
    axis = normalize_axis(fmt.name, axis, v.dim())
    blocks = split_blocks(v, axis, fmt.block_size)
    block_scale = split_blocks(scale.expand(v.shape), axis, fmt.block_size).select(axis + 1, 0)
    candidate = _beyond(abs_max(blocks, dim=axis + 1).squeeze(axis + 1) / block_scale, fmt) & (block_scale != 0)
    if not bool(candidate.any()):
        return 0
    picked = blocks.movedim(axis + 1, -1)[candidate]  # [blocks, block_size]
    return int(torch.count_nonzero(_beyond(picked.abs() / block_scale[candidate].unsqueeze(-1), fmt)))


def _packed_block_stats(v: Tensor, scale: Tensor, fmt: "NumericFormat", axis: int) -> Tensor:
    """[largest block absmax / block min nonzero |x|, min, max and min positive block scale,
    float32 exponent-field counts of the positive block scales], over the blocks that hold a
    nonzero finite value (their scale is what the format chose for data)."""
    axis = normalize_axis(fmt.name, axis, v.dim())
    magnitude = split_blocks(torch.where(torch.isfinite(v), v, 0.0).abs(), axis, fmt.block_size)
    block_max, block_min = magnitude.amax(axis + 1), _min_nonzero_abs(magnitude, axis + 1)
    block_scale = split_blocks(scale.float().expand(v.shape), axis, fmt.block_size).select(axis + 1, 0)
    used = (block_max > 0) & torch.isfinite(block_scale)
    positive = used & (block_scale > 0)
    head = [torch.where(used, block_max.double() / block_min.double(), 0.0).max(),
            torch.where(used, block_scale, math.inf).min(), torch.where(used, block_scale, -math.inf).max(),
            torch.where(positive, block_scale, math.inf).min()]
    return torch.cat([_stack_double(head), _exponent_field_counts(block_scale, positive)])


def _packed_quant_stats(v: Tensor, qv: Tensor, scale: Tensor, fmt: "NumericFormat", axis: int,
                        finite_only: bool) -> Tensor:
    """[overflow, underflow, sum x^2, sum (q-x)^2, sum x*q, sum q^2, elements summed], then
    ``_packed_block_stats`` for block formats; sums over elements finite in both when
    ``finite_only`` (else over all: void if any is not finite)."""
    # A transformed format's scale belongs to the transformed values (its quantization domain).
    overflow = _overflow_count(fmt.transform(v, axis) if fmt.transforms_operand else v, scale, fmt)
    underflow = torch.count_nonzero((qv == 0) & (v != 0))
    summed = v.new_tensor(v.numel())
    if finite_only:
        both_finite = torch.isfinite(v) & torch.isfinite(qv)
        summed = torch.count_nonzero(both_finite)
        v, qv = torch.where(both_finite, v, 0.0), torch.where(both_finite, qv, 0.0)
    packed = _stack_double([overflow, underflow, torch.linalg.vector_norm(v) ** 2, torch.dist(qv, v) ** 2,
                            (v * qv).sum(), torch.linalg.vector_norm(qv) ** 2, summed])
    if fmt.block_size is None:
        return packed
    return torch.cat([packed, _packed_block_stats(v, scale, fmt, axis)])


def _quantized_operands(x: Tensor, fmt: "NumericFormat", axis: int, amax: Optional[Tensor],
                        q: Optional[Tensor], scale: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """x, q and the scale in x's IEEE dtype; quantizes only when q or scale is missing."""
    if q is None or scale is None:
        # Formats hold no random state: observing x changes nothing the layers compute.
        fmt_q, fmt_scale = fmt.quantize_with_scale(x.detach(), axis=axis, amax=amax)
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
    return _packed_quant_stats(v, qv, scale, fmt, axis, finite_only=True)


def _unpack_block_stats(packed: Sequence[float]) -> dict:
    if not packed:
        return dict.fromkeys(_BLOCK_KEYS)
    ratio, scale_min, scale_max, positive_min = packed[:4]
    used = math.isfinite(scale_min)
    return {"block_dynamic_range_log2_max": math.log2(ratio) if ratio >= 1 else None,
            "block_scale_min": scale_min if used else None, "block_scale_max": scale_max if used else None,
            "block_scale_spread_log2": _log2_ratio(scale_max, positive_min),
            "block_scale_hist": {"edges": LOG2_EDGES, "counts": _log2_histogram(packed[4:], 0, torch.float32)}}


def unpack_quant_stats(packed: Sequence[float], numel: int) -> dict:
    """``quant_stats``'s dict from ``pack_quant_stats(...).tolist()`` and x's element count."""
    if numel == 0:
        return {**dict(zip(_QUANT_KEYS, (0, None, 0, None, None, None, None, None))), **dict.fromkeys(_BLOCK_KEYS)}
    overflow, underflow, signal, noise, dot, q_power, summed = packed[:_QUANT_SCALARS]
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
        "mse": noise / summed if summed > 0 else None,
        **_unpack_block_stats(packed[_QUANT_SCALARS:]),
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
    elements finite in both (sqnr_db is inf for an exact quantization); cosine of x and q;
    mse = mean((q-x)^2) over those elements.

    Block formats add, over the blocks holding a nonzero finite value:
    block_dynamic_range_log2_max (the largest log2(block absmax / block min nonzero |x|)),
    block_scale_min/max, block_scale_spread_log2 (log2 of max over min positive scale) and
    block_scale_hist (log2 histogram of the positive scales, ``log2_hist``'s bins); None
    for other formats.
    """
    x = x.detach()
    if x.numel() == 0:
        return unpack_quant_stats([], 0)
    v, qv, scale = _quantized_operands(x, fmt, axis, amax, q, scale)
    packed = _packed_quant_stats(v, qv, scale, fmt, axis, finite_only=False).tolist()
    if not math.isfinite(sum(packed[2:_QUANT_SCALARS])):  # Inf or NaN present: redo the sums over finite elements
        packed = _packed_quant_stats(v, qv, scale, fmt, axis, finite_only=True).tolist()
    return unpack_quant_stats(packed, x.numel())


# -- statistics levels (TENSOR_SAVE_STATS) ------------------------------------------------------
STATS_LEVELS = ("counts", "sample", "full")
SAMPLE_ELEMENTS = 1 << 14  # elements (whole blocks) the sampled statistics of one tensor look at
_EXACT_KEYS = ("numel", "shape", "dtype", "min", "max", "absmax", "zeros", "nans", "infs",
               "overflow", "overflow_ratio", "underflow", "underflow_ratio")


@functools.lru_cache(maxsize=256)
def _sample_positions(length: int, count: int) -> Tensor:
    """``count`` sorted positions out of ``length``, fixed by both (random, so strided layouts
    such as heads or channels do not alias)."""
    generator = torch.Generator().manual_seed(length)
    return torch.randperm(length, generator=generator)[:count].sort().values


def _sample(t: Tensor, axis: int, like: Tensor) -> Tensor:
    """A deterministic subset of about SAMPLE_ELEMENTS elements of ``t`` (shaped like ``like``;
    a 0-d scale is kept whole), as (before, axis, after) with the block axis in the middle:
    slices across ``axis`` are taken whole, so every block stays whole."""
    if t.dim() == 0:
        return t
    axis = axis % like.dim()
    view = t.expand(like.shape).reshape(math.prod(like.shape[:axis]), like.shape[axis], -1)
    dim = 0 if view.shape[0] > 1 else 2
    count = max(1, SAMPLE_ELEMENTS * view.shape[dim] // view.numel())
    if count >= view.shape[dim]:
        return view
    return view.index_select(dim, _sample_positions(view.shape[dim], count).to(t.device))


def _exact_counts(v: Tensor, fmt: Optional["NumericFormat"], axis: int, qv: Optional[Tensor],
                  scale: Optional[Tensor]) -> dict:
    """The fields every level gives exactly, with as few passes as the data allows: when x is
    all finite (seen from its min and max), nothing is masked, underflow is
    nonzero(x) - nonzero(q) (a zero never quantizes to nonzero), and overflow is looked for
    only where an absmax overflows (``_finite_overflow_count``)."""
    numel = v.numel()
    lo, hi = (float(bound) for bound in torch.aminmax(v))
    nonzero = int(torch.count_nonzero(v))
    finite = math.isfinite(lo) and math.isfinite(hi)
    nans = infs = 0
    if not finite:
        is_finite = torch.isfinite(v)
        nans, infs = int(torch.count_nonzero(torch.isnan(v))), int(torch.count_nonzero(torch.isinf(v)))
        lo = float(torch.where(is_finite, v, math.inf).min())
        hi = float(torch.where(is_finite, v, -math.inf).max())
    if fmt is None:
        return _exact_fields(numel, lo, hi, nonzero, nans, infs)
    if finite:
        underflow = nonzero - int(torch.count_nonzero(qv))
        overflow = _finite_overflow_count(v, scale, fmt, axis, max(abs(lo), abs(hi)))
    else:
        underflow = int(torch.count_nonzero((qv == 0) & (v != 0)))
        overflow = int(_overflow_count(v, scale, fmt))
    return _exact_fields(numel, lo, hi, nonzero, nans, infs, (overflow, underflow))


def _exact_fields(numel: int, lo: float, hi: float, nonzero: int, nans: int, infs: int,
                  flows: Optional[tuple[int, int]] = None) -> dict:
    """The exact fields from their counts and finite extremes (``flows``: overflow and underflow)."""
    has_finite = numel - nans - infs > 0
    result = {"numel": numel, "min": lo if has_finite else None, "max": hi if has_finite else None,
              "absmax": max(abs(lo), abs(hi)) if has_finite else None, "zeros": numel - nonzero,
              "nans": nans, "infs": infs}
    if flows is None:
        return result
    overflow, underflow = flows
    return {**result, "overflow": overflow, "overflow_ratio": overflow / numel,
            "underflow": underflow, "underflow_ratio": underflow / numel}


def exact_fields_from_counts(packed: Sequence[float], numel: int) -> dict:
    """The exact fields (``_EXACT_KEYS`` but shape and dtype) from the counts a quantization kernel
    took in its pass (``kernels.stats.FIELDS``, read to the host)."""
    nans, infs, nonzero, underflow, overflow, lo, hi = packed
    return _exact_fields(numel, lo, hi, int(nonzero), int(nans), int(infs), (int(overflow), int(underflow)))


def capture_stats(x: Tensor, fmt: Optional["NumericFormat"] = None, axis: int = -1, amax: Optional[Tensor] = None,
                  q: Optional[Tensor] = None, scale: Optional[Tensor] = None, level: str = "full",
                  counts: Optional[Tensor] = None) -> dict:
    """``tensor_stats`` (plus ``quant_stats`` with a format) at a cost set by ``level``:

    - ``full``: every field over every element;
    - ``sample``: the exact fields (``_EXACT_KEYS``: extremes, zeros/NaN/Inf, overflow and
      underflow) over every element; moments, histograms, errors and block statistics over a
      deterministic sample of about SAMPLE_ELEMENTS elements in whole blocks;
    - ``counts``: the exact fields only, the others None.

    ``stats_level`` says which; ``stats_sampled`` how many elements the non-exact fields saw.
    The result has the same keys at every level. ``counts``: the exact fields as the kernel that
    quantized x took them in its pass (``kernels.stats``), used instead of counting again.
    """
    if level not in STATS_LEVELS:
        raise ValueError(f"statistics level {level!r} is invalid; allowed: {', '.join(STATS_LEVELS)}")
    x = x.detach()
    if level == "counts" and counts is not None and fmt is not None and x.numel():
        return counts_stats(counts.tolist(), x.shape, x.dtype)
    qv = v_scale = None
    if fmt is not None and x.numel():
        v, qv, v_scale = _quantized_operands(x, fmt, axis, amax, q, scale)
    else:
        v = _as_ieee(x)
    if level == "full" or x.numel() == 0:
        sampled, result = x, tensor_stats(x)
        if fmt is not None:
            result.update(quant_stats(x, fmt, axis, amax, qv, v_scale))
        return {**result, "stats_level": level, "stats_sampled": x.numel()}
    if counts is not None and fmt is not None:
        exact = exact_fields_from_counts(counts.tolist(), x.numel())
    else:
        exact = _exact_counts(v, fmt, axis, qv, v_scale)
    if level == "counts":
        result, sampled = _counts_level_keys(x.dtype, fmt is not None), 0
    else:
        sampled = _sample(v, axis, v)
        result = tensor_stats(sampled)
        if fmt is not None:  # the block axis of a sample is 1
            result.update(quant_stats(sampled, fmt, 1, q=_sample(qv, axis, v), scale=_sample(v_scale, axis, v)))
        sampled = sampled.numel()
    return {**result, **exact, "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."),
            "stats_level": level, "stats_sampled": sampled}


def _counts_level_keys(dtype: torch.dtype, quantized: bool) -> dict:
    """Every key of ``capture_stats``' result, None (the counts level fills in the exact ones)."""
    return dict.fromkeys((*unpack_tensor_stats([], [0], dtype), *((*_QUANT_KEYS, *_BLOCK_KEYS) if quantized else ())))


def counts_stats(packed: Sequence[float], shape: Sequence[int], dtype: torch.dtype) -> dict:
    """``capture_stats`` at level ``counts`` of a quantized operand, from the counts its
    quantization kernel took (``kernels.stats.FIELDS``, read to the host)."""
    return {**_counts_level_keys(dtype, True), **exact_fields_from_counts(packed, math.prod(shape)),
            "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "stats_level": "counts",
            "stats_sampled": 0}
