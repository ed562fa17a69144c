"""The statistics levels (``TENSOR_SAVE_STATS``: counts, sample, full): what a capture computes at
each, and from what.

``capture_stats`` gives ``tensor_stats`` (plus ``quant_stats`` with a format) at a cost set by its
level; ``stats_from_packed`` and ``kernel_stats_serve`` read the packed statistics a quantization
kernel took in its pass instead of computing them again.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Literal, Optional, Sequence, get_args

import torch
from torch import Tensor

from megatron.quant.stats import packing, record
from megatron.quant.stats.reference import (
    as_ieee,
    finite_overflow_count,
    overflow_count,
    pack_stats,
    quantized_operands,
    record_groups,
    unpack_stats,
)

if TYPE_CHECKING:
    from megatron.quant.formats.interface import QuantFormat


StatsLevel = Literal["counts", "sample", "full"]
"""``TENSOR_SAVE_STATS``: what a capture's statistics cost (``capture_stats`` describes each level).
``"counts"``: the exact fields only; ``"sample"``: the exact fields over every element, the rest over
a sample; ``"full"``: every field over every element."""
STATS_LEVELS: tuple[StatsLevel, ...] = get_args(StatsLevel)
SAMPLE_ELEMENTS = 1 << 14  # elements (whole blocks) the sampled statistics of one tensor look at


@functools.lru_cache(maxsize=256)
def _sample_positions(length: int, count: int) -> Tensor:
    """``count`` sorted positions out of ``length``, fixed by both (random, so strided layouts
    such as heads or channels do not alias)."""
    generator = torch.Generator().manual_seed(length)
    return torch.randperm(length, generator=generator)[:count].sort().values


def _sample(t: Tensor, axis: int, like: Tensor, tile: Optional[int] = None) -> Tensor:
    """A deterministic subset of about SAMPLE_ELEMENTS elements of ``t`` (shaped like ``like``;
    a 0-d scale is kept whole), as (before, axis, after) with the block axis in the middle:
    slices across ``axis`` are taken whole, so every block stays whole. ``tile``: the format's
    blocks are tiles of that side in the last two dimensions; whole bands of ``tile`` rows are
    taken, as (matrices, rows, columns), so every tile stays whole and a tile."""
    if t.dim() == 0:
        return t
    if tile is not None:
        view = t.expand(like.shape).reshape(-1, *like.shape[-2:])
        bands = -(-view.shape[1] // tile)
        count = max(1, SAMPLE_ELEMENTS * bands // view.numel())
        if count >= bands:
            return view
        rows = (_sample_positions(bands, count)[:, None] * tile + torch.arange(tile)).flatten()
        return view.index_select(1, rows[rows < view.shape[1]].to(t.device))
    axis = axis % like.dim()
    view = t.expand(like.shape).reshape(math.prod(like.shape[:axis]), like.shape[axis], -1)
    dim = 0 if view.shape[0] > 1 else 2
    count = max(1, SAMPLE_ELEMENTS * view.shape[dim] // view.numel())
    if count >= view.shape[dim]:
        return view
    return view.index_select(dim, _sample_positions(view.shape[dim], count).to(t.device))


def _exact_counts(v: Tensor, fmt: Optional["QuantFormat"], axis: int, qv: Optional[Tensor],
                  scale: Optional[Tensor]) -> dict:
    """The fields every level gives exactly, with as few passes as the data allows: when x is
    all finite (seen from its min and max), nothing is masked, underflow is
    nonzero(x) - nonzero(q) (a zero never quantizes to nonzero), and overflow is looked for
    only where an absmax overflows (``finite_overflow_count``)."""
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
    counts = {"nans": nans, "infs": infs, "nonzero": nonzero, "min": lo, "max": hi}
    if fmt is None:
        return _exact_fields(counts, numel, ("tensor",))
    if finite:
        underflow = nonzero - int(torch.count_nonzero(qv))
        overflow = finite_overflow_count(v, scale, fmt, axis, max(abs(lo), abs(hi)))
    else:
        underflow = int(torch.count_nonzero((qv == 0) & (v != 0)))
        overflow = int(overflow_count(v, scale, fmt))
    return _exact_fields({**counts, "overflow": overflow, "underflow": underflow}, numel, ("tensor", "quant"))


def _exact_fields(counts: dict, numel: int, groups: tuple[record.Group, ...]) -> dict:
    """The exact keys of ``groups`` (``record.is_exact``) from the exact fields' values ``counts``."""
    return {"numel": numel, **record.derive(counts, numel, groups, exact=True)}


def exact_fields_from_counts(packed: Sequence[float], numel: int) -> dict:
    """The exact keys (those of a quantized record that read only counts-level fields, and numel) from
    the packed statistics a quantization kernel took in its pass (``kernels.stats``, read to the host)."""
    layout = packing.layout()
    return _exact_fields(layout.values(packed[:layout.counts_width]), numel, ("tensor", "quant"))


def capture_stats(x: Tensor, fmt: Optional["QuantFormat"] = None, axis: int = -1, amax: Optional[Tensor] = None,
                  q: Optional[Tensor] = None, scale: Optional[Tensor] = None, level: StatsLevel = "full",
                  kernel_stats: Optional[Tensor] = None) -> dict:
    """``tensor_stats`` (plus ``quant_stats`` with a format) at a cost set by ``level``:

    - ``full``: every field over every element;
    - ``sample``: the exact fields (``record.is_exact``: extremes, zeros/NaN/Inf, overflow and
      underflow) over every element; moments, histograms, errors and block statistics over a
      deterministic sample of about SAMPLE_ELEMENTS elements in whole blocks;
    - ``counts``: the exact fields only, the others None.

    ``stats_level`` says which; ``stats_sampled`` how many elements the non-exact fields saw.
    The result has the same keys at every level. ``kernel_stats``: the packed statistics the kernel
    that quantized x took in its pass (``kernels.stats``: the exact fields, or all of them), used
    instead of computing them again.
    """
    if level not in STATS_LEVELS:
        raise ValueError(f"statistics level {level!r} is invalid; allowed: {', '.join(STATS_LEVELS)}")
    x = x.detach()
    if x.numel() and kernel_stats_serve(kernel_stats, fmt, level):
        return stats_from_packed(kernel_stats.tolist(), x.shape, x.dtype, fmt, level)
    qv = v_scale = None
    if fmt is not None and x.numel():
        v, qv, v_scale = quantized_operands(x, fmt, axis, amax, q, scale)
    else:
        v = as_ieee(x)
    if level == "full" or x.numel() == 0:
        result = unpack_stats(pack_stats(x, fmt, axis, amax, qv, v_scale).tolist(), x.shape, x.dtype, fmt)
        return {**result, "stats_level": level, "stats_sampled": x.numel()}
    if kernel_stats is not None and fmt is not None:
        exact = exact_fields_from_counts(kernel_stats.tolist(), x.numel())
    else:
        exact = _exact_counts(v, fmt, axis, qv, v_scale)
    if level == "counts":
        result, sampled = _counts_level_keys(fmt), 0
    else:
        tile = fmt.block_size if fmt is not None and fmt.tiled and v.dim() >= 2 else None
        sampled = _sample(v, axis, v, tile)
        # the block axis of a sample is 1 (tiles: the rows)
        q_sampled, scale_sampled = ((None, None) if fmt is None
                                    else (_sample(qv, axis, v, tile), _sample(v_scale, axis, v, tile)))
        result = unpack_stats(pack_stats(sampled, fmt, 1, q=q_sampled, scale=scale_sampled).tolist(),
                              sampled.shape, x.dtype, fmt)
        sampled = sampled.numel()
    return {**result, **exact, "shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch."),
            "stats_level": level, "stats_sampled": sampled}


def _counts_level_keys(fmt: Optional["QuantFormat"]) -> dict:
    """Every key of ``capture_stats``' result, None (the counts level fills in the exact ones)."""
    return dict.fromkeys(record.record_keys(record_groups(fmt)))


def kernel_stats_serve(kernel_stats: Optional[Tensor], fmt: Optional["QuantFormat"], level: StatsLevel) -> bool:
    """True when the packed statistics a quantization kernel took (``kernel_stats``) make up
    ``capture_stats`` at ``level``: the exact fields at ``counts``, all the fields at ``full``."""
    return kernel_stats is not None and fmt is not None and (
        level == "counts" or (level == "full" and kernel_stats.numel() == packing.layout().width))


def stats_from_packed(packed: Sequence[float], shape: Sequence[int], dtype: torch.dtype,
                      fmt: Optional["QuantFormat"], level: StatsLevel) -> dict:
    """``capture_stats`` at ``level`` from packed statistics read to the host: all the fields
    (``full``, from ``pack_stats`` or a kernel), or a quantized operand's exact fields (``counts``,
    from its quantization kernel)."""
    numel = math.prod(shape)
    if level == "full":
        return {**unpack_stats(packed, shape, dtype, fmt), "stats_level": level, "stats_sampled": numel}
    return {**_counts_level_keys(fmt), **exact_fields_from_counts(packed, numel),
            "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "stats_level": level,
            "stats_sampled": 0}
