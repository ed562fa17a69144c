"""Which code quantizes a tensor: Triton kernels, ``torch.compile`` or eager torch.

``CUSTOM_QUANT_KERNELS`` chooses (default ``auto``):

- ``auto``: Triton kernels for CUDA tensors when Triton imports and the format has a kernel;
  otherwise the recipe's choice (``compile: true``: torch.compile, else eager torch);
- ``torch``: eager torch everywhere (the reference);
- ``compile``: torch.compile for round-to-nearest formats (stochastic rounding runs eager);
- ``triton``: Triton kernels wherever a format has one; CPU tensors use them only under
  ``TRITON_INTERPRET=1`` (Triton's interpreter, for tests), else the eager torch path.

The formats (``megatron.quant.formats``) stay the reference and the CPU path: a kernel must
give their bits exactly.

``select`` only decides; ``dispatch.wrap`` builds what was decided (``TritonFormat`` above it).
"""
from __future__ import annotations

import functools
import os
from typing import Literal, Mapping, Optional, get_args

import torch

from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.elementwise import CastFormat, ElementwiseFormat
from megatron.quant.formats.fp8_blocks import FP8BlockFormat
from megatron.quant.formats.mx import MXFormat
from megatron.quant.formats.nvfp4 import NVFP4Format

from .launch import interpreting


ENV = "CUSTOM_QUANT_KERNELS"
Backend = Literal["auto", "torch", "compile", "triton"]
"""``CUSTOM_QUANT_KERNELS``'s values, described at the top of this module."""
BACKENDS: tuple[Backend, ...] = get_args(Backend)
KernelPath = Literal["triton", "compiled", "eager"]
"""What quantizes a format's tensors on a device (``plan``)."""


def backend(environ: Optional[Mapping[str, str]] = None) -> Backend:
    """The backend ``CUSTOM_QUANT_KERNELS`` names (``auto`` when unset); ValueError lists the allowed values."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV}={env[ENV]!r} is not one of {', '.join(BACKENDS)}")
    if value == "triton" and not triton_available():
        raise ValueError(f"{ENV}=triton but Triton does not import here (pip install triton)")
    return value


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def supported(fmt: NumericFormat) -> bool:
    """True when a Triton kernel quantizes ``fmt`` (every option of it)."""
    kernels = (CastFormat, ElementwiseFormat, MXFormat, FP8BlockFormat, NVFP4Format)
    return isinstance(fmt, kernels) and fmt.dtype != torch.float32


def plan(fmt: NumericFormat, compile: bool, chosen: Backend, cuda: bool) -> KernelPath:
    """What quantizes ``fmt``'s tensors on this machine's device: "triton", "compiled" or "eager".
    ``compile``: the recipe's choice; ``chosen``: the backend; ``cuda``: whether tensors live there."""
    triton_wanted = chosen == "triton" or (chosen == "auto" and cuda and triton_available())
    if triton_wanted and supported(fmt) and (cuda or interpreting()):
        return "triton"
    if (chosen == "compile" or (chosen == "auto" and compile)) and fmt.rounding != "stochastic":
        return "compiled"
    return "eager"


def describe(formats: list[NumericFormat], compile: bool, chosen: Backend, cuda: bool) -> str:
    """The start line's words: the backend and each format's path, saying where a GPU runs eager."""
    paths: dict[str, list[str]] = {}
    for fmt in formats:
        label = fmt.name + (" (stochastic)" if fmt.rounding == "stochastic" else "")
        paths.setdefault(plan(fmt, compile, chosen, cuda), []).append(label)
    words = "; ".join(f"{p} {', '.join(sorted(set(names)))}" for p, names in sorted(paths.items())) or "none"
    warning = " (WARNING: eager quantization on the GPU)" if cuda and "eager" in paths else ""
    return f"kernels {chosen}: {words}{warning}"
