"""Tensor statistics and format-aware quantization statistics in torch: the reference path
(docs/interfaces.md section 3).

Statistics are computed on the tensor's device into one packed float64 vector (``packing``'s
layout, which the quantization kernels produce bit for bit in their pass) and turned into a dict
of plain Python numbers after a single transfer. ``pack_stats`` never syncs with the host and
``unpack_stats`` reads its transfer: the capture path uses them for GPU tensors so that the
training thread never waits for the device.

Conventions: min, max, mean, std and absmax are over the finite elements (NaN and Inf are
counted separately, so one NaN does not hide the rest); std is the population std (ddof=0);
undefined values (no finite element, zero norms) are None. Sums are float64, in the fixed order
``packing`` defines (the same on CPU, GPU and in the kernels); std comes from the sums of x and
x^2, so its relative error is about 1e-16 (mean / std)^2: negligible unless x is nearly constant.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import torch
from torch import Tensor

from megatron.quant.formats.base import abs_max, normalize_axis
from megatron.quant.formats.blocks import blocks_in_order, split_blocks
from megatron.quant.formats.saturation import overflow_bound
from megatron.quant.stats import packing, record

if TYPE_CHECKING:
    from megatron.quant.formats.interface import QuantFormat


# IEEE layouts read directly: (same-width int dtype, mantissa bits, exponent mask, bias).
# The exponent field of a normal value is floor(log2|x|) + bias: exact, and far cheaper than
# log2 or frexp. Narrower float types are widened to float32 first (exactly).
_LAYOUTS = {torch.float32: (torch.int32, 23, 0xFF, 127), torch.float64: (torch.int64, 52, 0x7FF, 1023)}
_TILE_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 22}  # elements per tile of the torch path (memory, launches)

Term = Callable[[Tensor, Optional[Tensor], Tensor, Optional[Tensor]], Tensor]
"""A field's element term: from a tile's x and q (quantized, None without a format) in block order,
``finite`` (the elements that exist with x finite) and ``both`` (those with q finite too; None
without a format), each element's contribution, the combine's identity where it has none (0 for a
sum, Inf for a min, -Inf for a max). The tile's value is its sum in ``packing``'s order (in float64:
compute a sum's products in float64), min or max, as the field combines."""


def _min_nonzero(x: Tensor, q: Optional[Tensor], finite: Tensor, both: Optional[Tensor]) -> Tensor:
    return torch.where(finite & (x != 0), x.abs(), math.inf)


# A field's ``torch`` in ``record.FIELDS`` names one of these: a function here that writes the field out
# by name, or the key of its element term, which ``_tile_row`` reduces as the field combines (the
# kernels' twins: ``WRITERS`` and ``TERMS`` of ``kernels.stats``).
WRITERS = ("_tile_row", "_block_fields")
TERMS: dict[str, Term] = {"min_nonzero": _min_nonzero}


# The fields ``_tile_row`` leaves at 0 where it has nothing to count (no format, nothing nonfinite).
_ZERO_UNLESS_COUNTED = ("nans", "infs", "underflow", "overflow", "both_finite", "signal", "noise", "dot", "q_power")


def _reduce(field: record.Field, values: Tensor) -> Tensor:
    if field.combine == "sum":
        return packing.pairwise_sum(values.double().flatten())
    return (values.amin() if field.combine == "min" else values.amax()).double()


def _ieee_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _LAYOUTS else torch.float32


def as_ieee(x: Tensor) -> Tensor:
    return x.to(_ieee_dtype(x.dtype))


def _log2_bins(v: Tensor, where: Tensor) -> Tensor:
    """``packing``'s log2 histogram of the elements of IEEE ``v`` where ``where`` (nonzero finite
    values only), as float64, from the exponent field: the binade bins are fields, the end bins
    sums of fields (subnormals are far below 2**LOG2_LOW too)."""
    int_dtype, mantissa_bits, mask, bias = _LAYOUTS[v.dtype]
    field = (v.contiguous().view(int_dtype) >> mantissa_bits) & mask
    field = torch.where(where, field, mask + 1)  # a bin of its own for the elements left out
    counts = torch.bincount(field.flatten(), minlength=mask + 2)[:mask + 1].double()
    first, last = bias + record.LOG2_LOW, bias + record.LOG2_HIGH
    return torch.cat([counts[:first].sum(0, keepdim=True), counts[first:last], counts[last:].sum(0, keepdim=True)])


def overflow_count(v: Tensor, scale: Tensor, fmt: "QuantFormat") -> Tensor:
    """Elements not representable without saturation: Inf, and finite x whose x / scale (the
    division the format does) rounds beyond max. A zero scale (an NVFP4 block whose E4M3
    scale underflowed) quantizes its block to zero: underflow, not overflow; a NaN scale (a
    block holding Inf or NaN) makes its finite elements NaN, neither."""
    return torch.count_nonzero(_overflows(v, scale, fmt))


def _overflows(v: Tensor, scale: Tensor, fmt: "QuantFormat") -> Tensor:
    return (_beyond(v.abs() / scale, fmt) & (scale != 0)) | torch.isinf(v)


def _beyond(ratio: Tensor, fmt: "QuantFormat") -> Tensor:
    """|x / scale| values that round beyond the format's max (``overflow_bound``)."""
    bound, inclusive = overflow_bound(fmt)
    return ratio >= bound if inclusive else ratio > bound


def finite_overflow_count(v: Tensor, scale: Tensor, fmt: "QuantFormat", axis: int, absmax: float) -> int:
    """``overflow_count`` of an all-finite v, element by element only where it can be nonzero:
    division is monotonic, so nothing overflows unless absmax / scale does (per tensor, or
    per block for block formats: then only the blocks whose absmax overflows are counted)."""
    if scale.numel() == 1:
        return 0 if not _beyond(v.new_tensor(absmax) / scale, fmt) else int(overflow_count(v, scale, fmt))
    if fmt.block_size is None:
        return int(overflow_count(v, scale, fmt))
    axis = normalize_axis(fmt.name, axis, v.dim())
    blocks = split_blocks(v, axis, fmt.block_size)
    block_scale = split_blocks(scale.expand(v.shape), axis, fmt.block_size).select(axis + 1, 0)
    candidate = _beyond(abs_max(blocks, dim=axis + 1).squeeze(axis + 1) / block_scale, fmt) & (block_scale != 0)
    if not bool(candidate.any()):
        return 0
    picked = blocks.movedim(axis + 1, -1)[candidate]  # [blocks, block_size]
    return int(torch.count_nonzero(_beyond(picked.abs() / block_scale[candidate].unsqueeze(-1), fmt)))


def _tile_row(x: Tensor, valid: Optional[Tensor], fmt: Optional["QuantFormat"] = None, q: Optional[Tensor] = None,
              xt: Optional[Tensor] = None, scale: Optional[Tensor] = None, all_finite: bool = False) -> Tensor:
    """One tile's row of packed statistics (``packing``'s layout): x, its quantized q and transformed
    xt (the values the scale divides) and the scale as (blocks, elements) in block order
    (``blocks_in_order``; a per-tensor scale 0-d), ``valid`` the elements that exist (None: all).
    ``all_finite``: x, q and xt are known to hold only finite values, and nothing is padded, so
    nothing needs masking (the same row, far fewer passes)."""
    zero = x.new_zeros((), dtype=torch.float64)
    f = dict.fromkeys(_ZERO_UNLESS_COUNTED, zero)
    f.update({name: x.new_full((), value, dtype=torch.float64) for name, value in  # fills: no host-to-device copy
              (("block_scale_min", math.inf), ("block_scale_positive_min", math.inf), ("block_scale_max", -math.inf),
               ("block_range_max", 0.0))})
    if all_finite:
        finite = None
        nonzero = x != 0
        f.update(nonzero=torch.count_nonzero(x), min=x.amin(), max=x.amax())
    else:
        finite = torch.isfinite(x) if valid is None else valid & torch.isfinite(x)
        nonzero = finite & (x != 0)
        real = (lambda mask: mask) if valid is None else (lambda mask: valid & mask)
        f.update(nans=torch.count_nonzero(real(torch.isnan(x))), infs=torch.count_nonzero(real(torch.isinf(x))),
                 nonzero=torch.count_nonzero(real(x != 0)), min=torch.where(finite, x, math.inf).amin(),
                 max=torch.where(finite, x, -math.inf).amax())
    names = ("sum", "sum_squares") + (("signal", "noise", "dot", "q_power") if fmt is not None else ())
    terms = x.new_empty((len(names), x.numel()), dtype=torch.float64)  # one tree sums them all
    terms[0] = (x if finite is None else torch.where(finite, x, 0.0)).flatten()
    torch.mul(terms[0], terms[0], out=terms[1])
    both = None
    if fmt is not None:
        if finite is None:
            xb, qb = terms[0], q.flatten().double()
            f.update(underflow=f["nonzero"] - torch.count_nonzero(q),  # a zero never quantizes to nonzero
                     both_finite=x.new_full((), x.numel(), dtype=torch.float64))
        else:
            both = finite & torch.isfinite(q)
            xb, qb = torch.where(both, x, 0.0).flatten().double(), torch.where(both, q, 0.0).flatten().double()
            f.update(underflow=torch.count_nonzero(real((q == 0) & (x != 0))), both_finite=torch.count_nonzero(both))
        overflows = _overflows(xt, scale, fmt)
        f["overflow"] = torch.count_nonzero(overflows if valid is None else valid & overflows)
        torch.mul(xb, xb, out=terms[2])
        torch.sub(qb, xb, out=terms[3])
        terms[3].square_()
        torch.mul(xb, qb, out=terms[4])
        torch.mul(qb, qb, out=terms[5])
    f.update(zip(names, packing.pairwise_sum(terms)))
    f["log2_hist"] = _log2_bins(x, nonzero)
    f["scale_hist"] = x.new_zeros(record.N_BINS, dtype=torch.float64)
    if fmt is not None and fmt.block_size is not None:
        _block_fields(f, x, finite, scale)
    if finite is None:  # the terms see the masks written out
        finite = torch.ones_like(x, dtype=torch.bool)
        both = None if fmt is None else finite
    layout = packing.layout()
    for field in layout.fields:
        if field.torch not in WRITERS:
            f[field.name] = _reduce(field, _term(field)(x, q, finite, both))
    return torch.cat([f[field.name].double().reshape(-1) for field in layout.fields])


def _term(field: record.Field) -> Term:
    """The element term ``field`` names (``record.FIELDS``); ValueError naming both when TERMS lacks it."""
    if field.torch not in TERMS:
        raise ValueError(f"statistics field {field.name!r} has no torch term; add one to TERMS of "
                         f"megatron/quant/stats/reference.py (its torch {field.torch!r} in FIELDS of "
                         f"megatron/quant/stats/record.py names it)")
    return TERMS[field.torch]


def _block_fields(f: dict, x: Tensor, finite: Optional[Tensor], scale: Tensor) -> None:
    """The block fields of ``_tile_row`` into ``f``: over the blocks holding a nonzero finite value,
    the largest absmax / min nonzero magnitude, the scales' extremes and log2 histogram."""
    magnitude = x.abs() if finite is None else torch.where(finite, x.abs(), 0.0)
    block_max, block_min = magnitude.amax(1), torch.where(magnitude == 0, math.inf, magnitude).amin(1)
    block_scale = scale[:, 0].float()
    used = (block_max > 0) & torch.isfinite(block_scale)
    positive = used & (block_scale > 0)
    f.update(block_range_max=torch.where(used, block_max.double() / block_min.double(), 0.0).amax(),
             block_scale_min=torch.where(used, block_scale, math.inf).amin(),
             block_scale_max=torch.where(used, block_scale, -math.inf).amax(),
             block_scale_positive_min=torch.where(positive, block_scale, math.inf).amin(),
             scale_hist=_log2_bins(block_scale, positive))


def quantized_operands(x: Tensor, fmt: "QuantFormat", axis: int, amax: Optional[Tensor],
                        q: Optional[Tensor], scale: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """x, q and the scale in x's IEEE dtype; quantizes only when q or scale is missing."""
    if q is None or scale is None:
        # Formats hold no random state: observing x changes nothing the layers compute.
        fmt_q, fmt_scale = fmt.quantize_with_scale(x.detach(), axis=axis, amax=amax)
        q = fmt_q if q is None else q
        scale = fmt_scale if scale is None else scale
    v = as_ieee(x)
    return v, q.detach().to(v.dtype), scale.detach().to(v.dtype)


def _known_finite(*tensors: Tensor) -> bool:
    """True when every element of the tensors is finite, asked on the CPU only: a host read costs
    nothing there, and on a GPU it would stall the stream (the masked route is taken instead)."""
    return all(t.device.type == "cpu" and all(math.isfinite(float(m)) for m in torch.aminmax(t)) for t in tensors)


def pack_stats(x: Tensor, fmt: Optional["QuantFormat"] = None, axis: int = -1, amax: Optional[Tensor] = None,
               q: Optional[Tensor] = None, scale: Optional[Tensor] = None) -> Tensor:
    """The packed statistics of x (``packing``'s layout), with a format also of its quantization
    (``q`` and ``scale`` as ``quantize_with_scale`` gave them; x is quantized when one is missing):
    on x's device, without a host sync, tile by tile (memory stays bounded: x may be memory-mapped)."""
    x = x.detach()
    if x.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    v = as_ieee(x)
    parts = [v, None]
    if fmt is not None:
        v, qv, scale = quantized_operands(x, fmt, axis, amax, q, scale)
        # A transformed format's scale belongs to the transformed values (its quantization domain).
        xt = as_ieee(fmt.transform(x.detach(), axis)) if fmt.transforms_operand else None
        per_element = scale.dim() or fmt.block_size is not None
        parts += [qv, xt, scale.expand(v.shape) if per_element else scale]
    ordered = [p if p is None or p.dim() == 0 else blocks_in_order(p, fmt, axis) for p in parts]
    if ordered[0].numel() != v.numel():  # padding in block order (a ragged last block, a block not 2**k long)
        ordered[1] = blocks_in_order(torch.ones_like(v, dtype=torch.bool), fmt, axis)
    if fmt is not None and ordered[3] is None:
        ordered[3] = ordered[0]  # x is what the scale divides
    per_tile = 1 << (max(1, _TILE_ELEMENTS.get(x.device.type, 1 << 18) // ordered[0].shape[1]).bit_length() - 1)
    all_finite = ordered[1] is None and _known_finite(*(p for p in (v, *parts[2:4]) if p is not None))
    rows = [_tile_row(*(p if p is None or p.dim() == 0 else p[start:start + per_tile] for p in ordered[:2]), fmt,
                      *(p if p.dim() == 0 else p[start:start + per_tile] for p in ordered[2:]), all_finite=all_finite)
            for start in range(0, ordered[0].shape[0], per_tile)]
    return packing.combine(torch.stack(rows))


def unpack_stats(packed: Sequence[float], shape: Sequence[int], dtype: torch.dtype,
                 fmt: Optional["QuantFormat"] = None) -> dict:
    """``tensor_stats``' dict, with ``fmt`` also ``quant_stats``', from ``pack_stats(...).tolist()``
    and x's shape and dtype: the keys of ``record.KEYS`` (an empty tensor has no blocks)."""
    numel = math.prod(shape)
    groups = record_groups(fmt)
    has_blocks = fmt is not None and fmt.block_size is not None and numel > 0
    derived = tuple(group for group in groups if group != "block" or has_blocks)
    values = packing.layout().values(packed if numel else [])
    return {"numel": numel, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
            **dict.fromkeys(record.key_names(*groups)), **record.derive(values, numel, derived)}


def record_groups(fmt: Optional["QuantFormat"]) -> tuple[record.Group, ...]:
    """The groups of keys a record of a tensor quantized by ``fmt`` (None: not quantized) holds."""
    return ("tensor",) if fmt is None else ("tensor", "quant", "block")


def tensor_stats(x: Tensor) -> dict:
    """numel, shape, dtype, min, max, mean, std, absmax, dynamic_range_log2 (log2 of absmax over the
    smallest nonzero finite |x|), zeros, nans, infs, log2_hist."""
    return unpack_stats(pack_stats(x).tolist(), x.shape, x.dtype)


def quant_stats(x: Tensor, fmt: "QuantFormat", axis: int = -1, amax: Optional[Tensor] = None,
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
    stats = unpack_stats(pack_stats(x, fmt, axis, amax, q, scale).tolist(), x.shape, x.dtype, fmt)
    return {key: stats[key] for key in record.key_names("quant", "block")}
