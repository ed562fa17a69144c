"""Quantizing the experts' GEMM operands over token groups: every expert's operand with its own scales,
all experts in one call of the format (a fixed number of launches whatever the number of experts).

An MoE layer's tokens arrive sorted by expert (``tokens_per_expert`` of them each, some possibly none):
``TokenGroups``. ``quantize_groups`` quantizes the concatenated tokens at once: blocks along the features
never hold two tokens, and blocks along the tokens (wgrad's operands) are kept inside one expert by moving
each expert's rows to a multiple of the block size in a zero-padded buffer (zeros change no block's scale
and quantize to zeros). ``StackedWeights`` quantizes all experts' weights as one [E, out, in] stack. Formats
whose scales read a per-tensor amax are not grouped here (each expert's amax is its own): ``groupable``
says which operand specs these take.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor

from megatron.quant.layers.delayed import is_delayed
from megatron.quant.layers.operand import same_quantization
from megatron.quant.recipes.operands import OperandSpec


def groupable(spec: OperandSpec) -> bool:
    """True when ``quantize_groups`` gives ``spec``'s per-expert bits from one call: no format, or one
    whose scales come from the operand's own blocks or elements (no per-tensor amax, delayed history or
    transform) and which rounds to nearest (stochastic noise is keyed per expert module)."""
    fmt = spec.fmt
    return fmt is None or not (fmt.needs_tensor_amax or fmt.transforms_operand or spec.stochastic
                               or is_delayed(fmt) or spec.history is not None)


@dataclass
class TokenGroups:
    """Rows of a [tokens, features] tensor split into consecutive groups, one per local expert."""

    counts: tuple[int, ...]  # tokens of each expert (host integers, as SequentialMLP takes them)
    device: torch.device
    _padded: dict[int, tuple[Tensor, int]] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def ends(self) -> Tensor:
        """Each group's end row (int32 on the tokens' device): the grouped GEMM's ``offs``."""
        return torch.tensor(list(itertools.accumulate(self.counts)), dtype=torch.int32, device=self.device)

    @property
    def total(self) -> int:
        return sum(self.counts)

    def padded_rows(self, block: int) -> tuple[Tensor, int]:
        """(each row's row in a layout where every group starts at a multiple of ``block``, that
        layout's length)."""
        if block not in self._padded:
            starts, padded_starts, at = [], [], 0
            for start, count in zip(itertools.accumulate((0,) + self.counts), self.counts):
                starts.append(start)
                padded_starts.append(at)
                at += -(-count // block) * block
            shift = torch.tensor([p - s for p, s in zip(padded_starts, starts)], device=self.device)
            rows = torch.arange(self.total, device=self.device)
            group = torch.searchsorted(self.ends, rows.to(torch.int32), right=True)
            self._padded[block] = (rows + shift[group], at)
        return self._padded[block]

    def split(self, x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        return torch.split(x, list(self.counts), dim=dim)


def _blocks_cross_tokens(spec: OperandSpec, ndim: int) -> bool:
    fmt = spec.fmt
    return fmt.block_size is not None and (fmt.tiled or spec.axis % ndim == 0)


def quantize_groups(x: Tensor, spec: OperandSpec, groups: TokenGroups) -> Tensor:
    """The GEMM operand of [tokens, features] ``x`` quantized per expert as ``spec`` says, in one call of
    its format (``groupable(spec)`` must hold); x itself without a format."""
    if spec.fmt is None:
        return x
    if not _blocks_cross_tokens(spec, x.dim()):
        return spec.fmt.quantize_for_gemm(x, axis=spec.axis)[0]
    rows, length = groups.padded_rows(spec.fmt.block_size)
    padded = x.new_zeros((length,) + tuple(x.shape[1:])).index_copy_(0, rows, x)
    return spec.fmt.quantize_for_gemm(padded, axis=spec.axis)[0].index_select(0, rows)


class StackedWeights:
    """The local experts' weights stacked [E, out, in] and quantized per (format, axis), kept while
    every weight is unchanged (the version-counter rule of ``QuantizedWeightCache``)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, Tensor]] = {}

    def get(self, weights: Sequence[Tensor], spec: OperandSpec) -> Tensor:
        version = tuple((w.data_ptr(), w._version) for w in weights)
        slot = (id(spec.fmt), None if spec.fmt is None or same_quantization(spec, spec) else spec.axis % 2)
        entry = self._entries.get(slot)
        if entry is None or entry[0] != version:
            with torch.no_grad():
                stacked = torch.stack([w.detach() for w in weights])
                if spec.fmt is not None:  # the 2-D weight's axis, one dimension in
                    stacked = spec.fmt.quantize_for_gemm(stacked, axis=spec.axis % 2 + 1)[0]
            entry = self._entries[slot] = (version, stacked)
        return entry[1]

    def invalidate(self) -> None:
        self._entries.clear()
