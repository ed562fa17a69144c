"""The format the layers call: a ``TritonFormat``, a ``CompiledFormat`` or the format itself, as ``select`` decides;
and where delayed scaling's history is updated by its kernel (``history``).

Above ``triton_format``, imported lazily so this package imports without Triton.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.compiled import CompiledFormat
from megatron.quant.formats.interface import QuantFormat

from .launch import interpreting
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


def serves_history(history: Tensor) -> bool:
    """True when the history kernel updates an amax history on its device, as ``wrap`` chooses the kernels
    (``auto``: CUDA with Triton; ``triton``: also CPU tensors under Triton's interpreter)."""
    chosen = backend()
    if history.is_cuda:
        return chosen == "triton" or (chosen == "auto" and triton_available())
    return chosen == "triton" and history.device.type == "cpu" and interpreting()


def updated_history(history: Tensor, amax_for_scale: Tensor, amax: Tensor, algo: str) -> tuple[Tensor, Tensor]:
    """``layers.delayed.updated_history`` by the history kernel, in one launch (where ``serves_history``)."""
    from .history import updated_history as on_device

    return on_device(history, amax_for_scale, amax, algo)
