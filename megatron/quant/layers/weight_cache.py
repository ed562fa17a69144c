"""Quantized weights cached per (format, axis) while the weight is unchanged (constant within an iteration)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant.layers.operand import (
    NoiseScope,
    Quantized,
    quantize_both_axes,
    quantize_operand,
    reusable_amax,
    same_quantization,
)
from megatron.quant.recipes.operands import OperandSpec
from megatron.quant.tensor_saver import Operand


class CachesQuantizedWeights(ABC):
    """A module that keeps quantized copies of its weights (``invalidate_quantized_weights`` forgets them)."""

    @abstractmethod
    def invalidate_quantized_weights(self) -> None:
        """Forget the cached copies (after updating weights through ``.data``)."""


class QuantizedWeightCache:
    """Fake-quantized weights per (format, axis), valid while the weight is unchanged.

    Keyed on the weight's storage and autograd version counter, which every in-place update
    (torch optimizers) bumps: a weight is quantized once per optimizer step, not once per
    micro-batch (stochastic rounding: once per iteration, the noise key being part of the
    entry). Writes through ``.data`` (megatron-core's mixed-precision optimizers copy main
    params that way) bypass the counter: call ``invalidate()`` after such a step.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, Optional[int]], tuple[tuple, Quantized, OperandSpec]] = {}

    def get(self, weight: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup],
            noise: Optional[NoiseScope], partner: Optional[OperandSpec] = None) -> Quantized:
        """The weight quantized as ``spec`` says; ``partner``: the spec of its other GEMM (dgrad for
        fprop), quantized in the same read where a kernel does both axes."""
        if spec.fmt is None:
            return Quantized(weight)
        slot, version = self._key(weight, spec, noise)
        entry = self._entries.get(slot)
        if (entry is None or entry[0] != version) and partner is not None and weight.dim() == 2 \
                and {spec.axis % 2, partner.axis % 2} == {0, 1}:
            rows, cols = (spec, partner) if spec.axis % 2 == 0 else (partner, spec)
            with torch.no_grad():
                both = quantize_both_axes(weight, rows, cols, group, noise, per_sample=False)
            for done_spec, done in zip((rows, cols), both or ()):
                done_slot, done_version = self._key(weight, done_spec, noise)
                self._entries[done_slot] = (done_version, done, done_spec)
            entry = self._entries.get(slot)
        if entry is None or entry[0] != version:
            # Another axis's entry of the same weight version holds its TP-reduced amax already.
            done = [(e[1], e[2]) for e in self._entries.values() if e[0][:2] == version[:2]]
            amax = next((a for a in (reusable_amax(q, s, spec) for q, s in done) if a is not None), None)
            with torch.no_grad():
                entry = (version, quantize_operand(weight, spec, group, noise, amax=amax, per_sample=False), spec)
            self._entries[slot] = entry
        return entry[1]

    @staticmethod
    def _key(weight: Tensor, spec: OperandSpec, noise: Optional[NoiseScope]) -> tuple[tuple, tuple]:
        """(slot, version) of ``spec``'s entry: formats without blocks and without random rounding
        give the same values on any axis; the noise key is part of the version."""
        slot = (id(spec.fmt), None if same_quantization(spec, spec) else spec.axis)
        bits = None if noise is None else noise.bits(spec, per_sample=False)
        return slot, (weight.data_ptr(), weight._version, bits)

    def seen(self, weight: Tensor, spec: OperandSpec, group: Optional[dist.ProcessGroup],
             noise: Optional[NoiseScope]) -> Operand:
        """The saver's record of the cached weight (quantized again with the same amax and noise)."""
        used = self.get(weight, spec, group, noise)
        with torch.no_grad():
            return quantize_operand(weight, spec, group, noise, amax=used.amax, per_sample=False, capture=True).seen

    def invalidate(self) -> None:
        self._entries.clear()
