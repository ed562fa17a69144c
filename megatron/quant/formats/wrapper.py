"""``FormatWrapper``: a ``QuantFormat`` that runs a format another way (compiled, Triton kernels).

Every member of the interface is forwarded to the wrapped format one by one (plain functions, which
``torch.compile`` traces through), so a wrapper offers exactly ``QuantFormat`` (nothing reaches the
format's internals through it); subclasses replace ``run`` (and ``amax_of``, ``serves``, ``dual_axis``)
where they run it differently. The interface's conveniences call this object's own ``run``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .interface import QuantFormat
from .quantization import VALUE, Quantization, Want
from .random_bits import RandomBits


class FormatWrapper(QuantFormat):
    """``fmt`` (a format, or another wrapper) as a ``QuantFormat``, every member its own."""

    def __init__(self, fmt: QuantFormat) -> None:
        self.fmt = fmt

    name = property(lambda self: self.fmt.name)
    bits = property(lambda self: self.fmt.bits)
    max_value = property(lambda self: self.fmt.max_value)
    min_positive = property(lambda self: self.fmt.min_positive)
    options = property(lambda self: self.fmt.options)
    rounding = property(lambda self: self.fmt.rounding)
    scaling = property(lambda self: self.fmt.scaling)
    needs_tensor_amax = property(lambda self: self.fmt.needs_tensor_amax)
    amax_per_row = property(lambda self: self.fmt.amax_per_row)
    transforms_operand = property(lambda self: self.fmt.transforms_operand)
    block_size = property(lambda self: self.fmt.block_size)
    block_shape = property(lambda self: self.fmt.block_shape)
    tiled = property(lambda self: self.fmt.tiled)
    axis_free = property(lambda self: self.fmt.axis_free)
    element = property(lambda self: self.fmt.element)
    dtype = property(lambda self: self.fmt.dtype)
    kernel_contract = property(lambda self: self.fmt.kernel_contract)
    dual_axis = False

    def run(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *, want: Want = VALUE,
            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
            cross_noise: Optional[RandomBits] = None) -> Quantization:
        return self.fmt.run(x, axis, amax, want=want, noise=noise, generator=generator, cross_noise=cross_noise)

    def amax_of(self, x: Tensor, axis: int = -1) -> Tensor:
        return self.fmt.amax_of(x, axis)

    def transform(self, x: Tensor, axis: int = -1) -> Tensor:
        return self.fmt.transform(x, axis)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fmt!r})"
