"""Exact emulation of low-precision numeric formats (fake quantization), pure torch.

    fmt = get_format("mxfp8")                 # or "hifp8", "fp8_e4m3", "nvfp4", ...
    y = fmt.quantize(x, axis=-1)              # quantize, then dequantize; x's shape and dtype
    y, scale = fmt.quantize_with_scale(x)     # the element grid was applied to x / scale
    done = fmt.run(x, -1, want=Want(gemm=True))   # one record: done.operand, done.tensor_scale

Everything a format object offers is ``QuantFormat`` (``interface.py``); each quantization is one
``run`` returning a ``Quantization`` of what its ``Want`` asked for (``quantization.py``).
``python -m megatron.quant.formats list`` shows every format; ``... values hifp8`` prints
a format's codes and values. Nothing here imports Megatron.
"""
from .base import NumericFormat, abs_max
from .hifloat8 import HiFloat8Format
from .interface import QuantFormat
from .quantization import Quantization, Want
from .registry import ALIASES, canonical_name, get_format, is_passthrough, list_formats, quantize

__all__ = [
    "ALIASES",
    "HiFloat8Format",
    "NumericFormat",
    "QuantFormat",
    "Quantization",
    "Want",
    "abs_max",
    "canonical_name",
    "get_format",
    "is_passthrough",
    "list_formats",
    "quantize",
]
