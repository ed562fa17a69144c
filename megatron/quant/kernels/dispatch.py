"""The format the layers call: a ``TritonFormat``, a ``CompiledFormat`` or the format itself, as ``select`` decides.

Above ``triton_format``, imported lazily so this package imports without Triton.
"""
from __future__ import annotations

from typing import Optional

import torch

from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.compiled import CompiledFormat
from megatron.quant.formats.interface import QuantFormat

from .select import Backend, backend, plan, supported, triton_available


def wrap(fmt: NumericFormat, compile: bool, chosen: Optional[Backend] = None, cuda: Optional[bool] = None
         ) -> QuantFormat:
    """``fmt`` as the layers should call it: a ``TritonFormat`` (kernels for the tensors they
    serve, ``fmt`` or its compiled twin for the others), a ``CompiledFormat``, or ``fmt`` itself.
    ``chosen``: the backend (default: the environment's); ``cuda``: whether CUDA is there."""
    chosen = backend() if chosen is None else chosen
    cuda = torch.cuda.is_available() if cuda is None else cuda
    fallback = CompiledFormat(fmt) if plan(fmt, compile, chosen, False) == "compiled" else fmt
    if supported(fmt) and (chosen == "triton" or (chosen == "auto" and cuda and triton_available())):
        from .triton_format import TritonFormat

        return TritonFormat(fmt, fallback)
    return fallback
