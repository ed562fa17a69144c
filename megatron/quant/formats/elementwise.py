"""Elementwise formats: plain dtype casts (fp32, bf16, fp16) and grid formats (FP8, HiF8)
with optional per-tensor scaling."""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .base import NumericFormat, encode_scale, float32_copy
from .contract import KernelContract, TensorScale
from .grid import BF16_RULE, FP16, ElementGrid
from .rounding import DRAW_BITS

_BF16_DROPPED_BITS = 16  # bfloat16 is the top half of a float32


def _one(x: Tensor) -> Tensor:
    return torch.ones((), dtype=torch.float32, device=x.device)


class CastFormat(NumericFormat):
    """A round trip through a torch dtype: fp32 (identity), bf16, fp16 (IEEE: overflow is Inf)."""

    eager_chunks = False  # a single cast already is one pass

    def __init__(self, name: str, dtype: torch.dtype, options: dict[str, Any]):
        super().__init__(options)
        finfo = torch.finfo(dtype)
        self.name = name
        self.dtype = dtype
        self.bits = finfo.bits
        self.max_value = float(finfo.max)
        self.min_positive = float(finfo.smallest_normal * finfo.eps)

    @functools.cached_property
    def kernel_contract(self) -> KernelContract | None:
        """bf16 by its bit rounding, fp16 as IEEE's grid (overflow to Inf); fp32 needs no kernel."""
        if self.dtype == torch.float32:
            return None
        rule, overflow = (BF16_RULE, "saturate") if self.dtype == torch.bfloat16 else (FP16.rule, "inf")
        return self._contract(rule, overflow, unchanged_dtype=self.dtype)

    def _quantize(self, x, axis, amax, uniform, split):
        if self.dtype == torch.float32 or x.dtype == self.dtype:  # already representable
            return x, _one(x), None
        # Rounded with integer ops, never as a dtype round trip: inductor folds x.to(bf16).to(fp32)
        # into a no-op, which made the compiled casts return x unchanged.
        x32 = x.float()
        if self.dtype == torch.float16:
            return FP16.round(x32, self.rounding, "inf", uniform), _one(x), None
        return _round_bf16(x32, uniform, DRAW_BITS[self.rounding]), _one(x), None


def _round_bf16(x: Tensor, uniform: Tensor | None, draw_bits: int) -> Tensor:
    """float32 to bfloat16 values, to nearest even or stochastically (``uniform`` given, ``draw_bits``
    of it drawn per element).

    On the float32 bit pattern bf16 is exactly "clear the low 16 bits", which is linear within
    each binade (subnormals included) and carries into the exponent on the way up (to Inf past
    the largest bf16). Nearest adds half an ulp less one plus the kept lowest bit (ties to even);
    stochastic adds integer noise uniform over all 2**16 dropped-bit values, so it is exactly
    unbiased; with fewer ``draw_bits`` (8: ``rounding.round_stochastic_``'s hardware draw) the noise
    is that many random bits aligned with the top of the dropped ones, whose carry rounds up. bf16's
    range is beyond the grid routine's, hence this separate path.
    """
    bits = x.view(torch.int32)
    if uniform is None:
        added = ((bits >> _BF16_DROPPED_BITS) & 1) + ((1 << (_BF16_DROPPED_BITS - 1)) - 1)
    else:
        drawn = min(draw_bits, _BF16_DROPPED_BITS)
        added = (uniform * (1 << drawn)).to(torch.int32) << (_BF16_DROPPED_BITS - drawn)
    truncated = (bits + added) & -(1 << _BF16_DROPPED_BITS)
    return torch.where(torch.isnan(x), x, truncated.view(torch.float32))


class ElementwiseFormat(NumericFormat):
    """Each element rounded onto the ``element`` grid. With per-tensor scaling it is applied to
    ``x * encode`` and decoded with ``1 / encode``, where ``encode = target / amax`` in float32 as
    Transformer Engine computes it (``encode_scale``) and ``target = scale_target / 2**margin``.

    ``scaling="tensor"``: the amax is x's own (TE's current scaling); ``power_of_two_scales``
    (Float8CurrentScaling's option) rounds ``encode`` down to a power of two.
    ``scaling="delayed"`` (TE's DelayedScaling): the amax comes from the operand's amax history,
    which the layers keep (``megatron.quant.layers.delayed``) and pass as ``amax``; called without one
    (outside a layer) x's own amax stands in, as for a history of one current value.
    """

    def __init__(self, name: str, element: ElementGrid, options: dict[str, Any]):
        super().__init__(options)
        self._describe_elements(name, element)
        self.scaling = options["scaling"]
        self.needs_tensor_amax = self.scaling in ("tensor", "delayed")
        target = options.get("scale_target") or element.max_value
        self.scale_target = target * 2.0 ** -options.get("margin", 0)  # exact

    @functools.cached_property
    def kernel_contract(self) -> KernelContract:
        tensor = TensorScale(self.scale_target, bool(self.options.get("power_of_two_scales")))
        return self._contract(self.element.rule, self.options["overflow"],
                              tensor_scale=tensor if self.needs_tensor_amax else None)

    def _quantize(self, x, axis, amax, uniform, split):
        if self.scaling == "none":
            return self._round_(float32_copy(x), x, uniform), _one(x), None
        amax = self._abs_max(x) if amax is None else amax
        encode = encode_scale(amax, self.scale_target, bool(self.options.get("power_of_two_scales")))
        decode = 1 / encode
        scaled = x * encode if x.dtype == torch.float32 else x.float().mul_(encode)
        elements = self._round_(scaled, x, uniform)
        return (elements if split else elements.mul_(decode)), decode, decode

    def _round_(self, x32: Tensor, signs: Tensor, uniform: Tensor | None) -> Tensor:
        """Round our own float32 temporary in place (``uniform``: noise, which it overwrites)."""
        return self.element.round_(x32, signs, self.rounding, self.options["overflow"], uniform)
