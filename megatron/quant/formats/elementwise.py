"""Elementwise formats: plain dtype casts (fp32, bf16, fp16) and grid formats (FP8, HiF8)
with optional per-tensor scaling."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import NumericFormat, abs_max, float32_copy, tensor_scale
from .grid import FP16, ElementGrid

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

    def _quantize(self, x, axis, amax, generator):
        if self.dtype == torch.float32 or x.dtype == self.dtype:  # already representable
            return x, _one(x)
        if self.rounding == "nearest":
            return x.to(self.dtype), _one(x)
        x32 = x.float()
        uniform = self._uniform(x32, generator)
        if self.dtype == torch.float16:
            return FP16.round(x32, "stochastic", "inf", uniform), _one(x)
        return _stochastic_bf16(x32, uniform), _one(x)


def _stochastic_bf16(x: Tensor, uniform: Tensor) -> Tensor:
    """Stochastic rounding of float32 to bfloat16 values: add random low bits, then truncate.

    bf16's spacing in 2**-133 .. 2**120 is beyond the grid routine's range, but on the
    float32 bit pattern bf16 is exactly "clear the low 16 bits", which is linear within each
    binade (subnormals included) and carries into the exponent on the way up. The integer
    noise is uniform over all 2**16 dropped-bit values, so the result is exactly unbiased.
    """
    noise = (uniform * (1 << _BF16_DROPPED_BITS)).to(torch.int32)
    truncated = (x.view(torch.int32) + noise) & -(1 << _BF16_DROPPED_BITS)
    return torch.where(torch.isnan(x), x, truncated.view(torch.float32))


class ElementwiseFormat(NumericFormat):
    """Each element rounded onto the ``element`` grid; with ``scaling="tensor"`` it is applied to
    ``x / scale`` where ``scale = amax / target`` (Transformer Engine's current scaling,
    written as a divisor)."""

    def __init__(self, name: str, element: ElementGrid, options: dict[str, Any]):
        super().__init__(options)
        self._describe_elements(name, element)
        self.scaling = options["scaling"]
        self.needs_tensor_amax = self.scaling == "tensor"
        self.scale_target = options.get("scale_target") or element.max_value

    def _quantize(self, x, axis, amax, generator):
        if self.scaling == "none":
            return self._round_(float32_copy(x), x, generator), _one(x)
        scale = tensor_scale(abs_max(x) if amax is None else amax, self.scale_target)
        scaled = x / scale if x.dtype == torch.float32 else x.float().div_(scale)
        return self._round_(scaled, x, generator).mul_(scale), scale

    def _round_(self, x32: Tensor, signs: Tensor, generator: torch.Generator | None) -> Tensor:
        """Round our own float32 temporary in place."""
        uniform = self._uniform(x32, generator)
        return self.element.round_(x32, signs, self.rounding, self.options["overflow"], uniform)

