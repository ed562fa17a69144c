"""Statistics a capture adds to ``capture_stats``' fields, keyed apart from them (the packed layout is
``stats.packing``'s): ``block_scales`` (per-block statistics of a block format), ``whatif`` (the same
operand under other formats), and what TE's names read that the lab's fields lack (``l1_norm``,
``scale_min``/``scale_max``, ``max_blockwise_dynamic_range_*``).

``OperandExtras`` is hashable: the saver's per-iteration memo of a weight's statistics keys on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from megatron.quant.capture.site import CaptureSite, Operand
from megatron.quant.capture.whatif import WhatIfFormats
from megatron.quant.formats.base import NumericFormat
from megatron.quant.stats import (
    NUMEL,
    SAMPLE_ELEMENTS,
    block_key_names,
    block_scale_stats,
    blockwise_name,
    capture_stats,
    key_names,
    max_blockwise_dynamic_range,
)

MIN_GROUPS = 8  # rows (or tile rows) a what-if sample takes at least


@dataclass(frozen=True)
class ExtraNeeds:
    """What to add: what-if sources (``whatif.WhatIfFormats``), TE's extra fields, per-block statistics."""

    whatif: tuple[str, ...] = ()
    te_fields: bool = False  # l1_norm, scale_min, scale_max
    blockwise: tuple[tuple[int, int, bool], ...] = ()  # TE's max_blockwise_dynamic_range options
    block_scales: bool = True

    def __bool__(self) -> bool:
        return bool(self.whatif or self.te_fields or self.blockwise or self.block_scales)


@dataclass(frozen=True, eq=False)
class OperandExtras:
    """The extras of one record: where it was captured, under which name, what to add and at which level."""

    site: CaptureSite
    tensor_name: str
    needs: ExtraNeeds
    level: str
    formats: WhatIfFormats

    def key(self) -> tuple:
        return (self.site, self.tensor_name, self.needs, self.level, id(self.formats))

    def compute(self, operand: Operand) -> dict:
        x = operand.tensor.detach()
        result: dict = {}
        if x.numel() == 0:
            return result
        needs = self.needs
        if needs.block_scales and self.level != "counts" and operand.fmt is not None:
            blocks = _operand_block_scales(operand, self.level == "sample")
            if blocks is not None:
                result["block_scales"] = blocks
        if needs.te_fields:
            result["l1_norm"] = float(torch.where(torch.isfinite(x), x, 0).double().abs().sum())
            result.update(_scale_range(operand))
        for block_size, dims, both in needs.blockwise:
            result[blockwise_name(block_size, dims, both)] = max_blockwise_dynamic_range(x, block_size, dims, both)
        whatif = {}
        for source in needs.whatif:
            found = self.formats.format_for(source, self.site.module, self.site.role, self.site.layer_idx,
                                            self.tensor_name)
            if found is not None:
                whatif[source] = whatif_stats(x.reshape(-1, x.shape[-1]), *found, self.level)
        if whatif:
            result["whatif"] = whatif
        return result


def _operand_block_scales(operand: Operand, sampled: bool) -> Optional[dict]:
    """``block_scale_stats`` of the operand's own quantization: over every block, or (``sampled``) over
    whole blocks of about ``SAMPLE_ELEMENTS`` elements where its blocks lie along rows of a 2-D view."""
    x, fmt, axis = operand.tensor.detach(), operand.fmt, operand.axis
    contract = fmt.kernel_contract
    if contract is None or not contract.blocked:
        return None
    scale = operand.scale
    if scale is None:
        _, scale = fmt.quantize_with_scale(x, axis=axis, amax=operand.amax)
    amax = operand.amax
    last = axis % x.dim() == x.dim() - 1
    if sampled and scale.dim() and (x.dim() == 2 or (last and not contract.tiled)):
        if amax is None and not fmt.transforms_operand:
            amax = x.abs().amax()  # the NVFP4 scale's encoding is the whole tensor's
        axis = axis if x.dim() == 2 else -1
        view = x.reshape(-1, x.shape[-1])
        x, scale = _whole_blocks(view, fmt, axis, scale.expand(x.shape).reshape(view.shape))
    return block_scale_stats(x, fmt, axis, scale, amax)


def _scale_range(operand: Operand) -> dict:
    """The smallest nonzero and the largest scale the operand's quantization used (None unquantized)."""
    if operand.fmt is None:
        return {"scale_min": None, "scale_max": None}
    scale = operand.scale
    if scale is None:
        _, scale = operand.fmt.quantize_with_scale(operand.tensor.detach(), axis=operand.axis, amax=operand.amax)
    return _range_of(scale)


def _range_of(scale: Tensor) -> dict:
    """The smallest nonzero and the largest finite scale (0 and 0 when there is none)."""
    scale = scale.detach()
    lowest, highest = (float(v) for v in torch.aminmax(scale))
    if not (math.isfinite(lowest) and math.isfinite(highest)):  # a block holding Inf or NaN: mask them
        scale = torch.where(torch.isfinite(scale), scale, 0.0)
        highest = float(scale.amax())
    if lowest <= 0 or not math.isfinite(lowest):
        lowest = float(torch.where(scale > 0, scale, math.inf).amin())
    return {"scale_min": lowest if math.isfinite(lowest) else 0.0, "scale_max": highest}


def whatif_stats(x: Tensor, fmt: NumericFormat, axis: int, level: str) -> dict:
    """The quantization statistics of x ([rows, cols]) under ``fmt`` (blocks along ``axis``), with the
    scale range and the per-block statistics. At the ``sample`` level all of them, counts included, come
    from whole blocks of about ``SAMPLE_ELEMENTS`` elements quantized with the whole tensor's amax (a
    what-if quantization of every element would cost a training step per format on a CPU); at ``counts``
    and ``full`` from every element."""
    sampled = level == "sample"
    (part,) = _whole_blocks(x, fmt, axis) if sampled else (x,)
    amax = x.abs().amax().float() if part is not x else None
    q, scale = fmt.quantize_with_scale(part, axis=axis, amax=amax)
    stats = capture_stats(part, fmt, axis, amax=amax, q=q, scale=scale, level="full" if sampled else level)
    result = {key: stats[key] for key in (NUMEL, *key_names(view="whatif"))}  # the record's what-if view
    result["stats_sampled"] = part.numel() if level != "counts" else 0
    result.update(_range_of(scale))
    if level != "counts":
        blocks = block_scale_stats(part, fmt, axis, scale, amax)
        if blocks is not None:
            result["block_scales"] = {key: blocks[key] for key in block_key_names(histograms=False)}
    return result


def _whole_blocks(x: Tensor, fmt: NumericFormat, axis: int, *alike: Tensor) -> tuple[Tensor, ...]:
    """About ``SAMPLE_ELEMENTS`` elements of x ([rows, cols]) in whole blocks, and the same elements of
    each of ``alike`` (x's shape): rows when the blocks run along rows (``axis`` -1 or 1), columns when
    along columns (0); for tiles, whole tile rows; at least ``MIN_GROUPS`` of them, drawn at positions
    fixed by the size (random, so that strided layouts such as heads or channels do not alias)."""
    contract = fmt.kernel_contract
    side = contract.block_size if contract is not None and contract.tiled else 1
    view = x if axis % 2 else x.t()
    groups = view.shape[0] // side
    wanted = max(MIN_GROUPS, -(-SAMPLE_ELEMENTS // (view.shape[1] * side)))
    if wanted >= groups or view.shape[0] % side:
        return (x, *alike)
    generator = torch.Generator().manual_seed(groups)
    starts = torch.randperm(groups, generator=generator)[:wanted].sort().values * side
    rows = (starts[:, None] + torch.arange(side)).flatten().to(x.device)
    picked = [(t if axis % 2 else t.t()).index_select(0, rows) for t in (x, *alike)]
    return tuple(p if axis % 2 else p.t() for p in picked)
