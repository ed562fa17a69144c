"""What a quantization is asked for (``Want``) and what it returns (``Quantization``): the request and
the record of ``QuantFormat.run``, the one method every format object writes (``formats.interface``).

A quantization gives one of two things. The *value*: x fake-quantized, in x's shape, dtype and domain
(what ``quantize`` returns), optionally with the scale x was divided by and the statistics a kernel took
in the same pass. Or the *GEMM operand*: what a GEMM kernel decodes and the per-tensor factor it applies
to its FP32 accumulator afterwards, optionally with x's own amax (delayed scaling records it) or along
both of x's last two axes (a weight for fprop and dgrad). A request asks for one of the two, so an
implementation never mixes the two passes; what a request leaves out is None in the record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from torch import Tensor

KernelStats = Literal["exact", "full"]
"""The statistics a kernel takes in its quantizing pass (``stats.packing``'s layout): ``"exact"``, the
fields that do not depend on the order of reduction (capture's ``counts`` level); ``"full"``, all of them."""
KERNEL_STATS: tuple[KernelStats, ...] = get_args(KernelStats)


@dataclass(frozen=True)
class Want:
    """What ``QuantFormat.run`` returns besides the value (or, with ``gemm``, the operand)."""

    gemm: bool = False
    """The GEMM operand and its tensor scale instead of the fake-quantized value."""
    scale: bool = False
    """With the value: the float32 scale, broadcastable to x, that the element grid was applied to x (or
    to its transform) divided by."""
    stats: Optional[KernelStats] = None
    """With the value: the packed statistics a kernel took in the same pass (None in the record where no
    kernel took any: the torch path takes none, the capture computes them)."""
    amax: bool = False
    """With the operand: x's own ``amax_of`` (delayed scaling's history records it), from the quantizing
    read where a kernel takes both."""
    both_axes: bool = False
    """With the operand: also along the other of x's last two axes (``Quantization.cross``), from one
    read where the object is ``dual_axis``."""

    def __post_init__(self) -> None:
        if self.stats is not None and self.stats not in KERNEL_STATS:
            raise ValueError(f"Want: stats={self.stats!r} is not one of {[None, *KERNEL_STATS]}")
        extras = ({"scale": self.scale, "stats": self.stats is not None} if self.gemm
                  else {"amax": self.amax, "both_axes": self.both_axes})
        given = [name for name, asked in extras.items() if asked]
        if given:
            owner, other = ("the operand (gemm=True)", "the value") if self.gemm else ("the value", "gemm=True")
            raise ValueError(f"Want: {', '.join(given)} goes with {other}, not with {owner}")
        if self.amax and self.both_axes:
            raise ValueError("Want: amax=True with both_axes=True is not offered; ask each axis for its amax")


VALUE = Want()
VALUE_WITH_SCALE = Want(scale=True)
GEMM = Want(gemm=True)
GEMM_WITH_AMAX = Want(gemm=True, amax=True)
GEMM_BOTH_AXES = Want(gemm=True, both_axes=True)


@dataclass(frozen=True)
class Quantization:
    """What one quantization of x returned; each field None unless its ``Want`` asked for it."""

    value: Optional[Tensor] = None
    """x fake-quantized: x's shape and dtype, back in x's domain after a Hadamard transform."""
    scale: Optional[Tensor] = None
    """``Want.scale``: float32, broadcastable to x; ones for unscaled formats."""
    stats: Optional[Tensor] = None
    """``Want.stats``: the kernel's packed statistics (float64 on x's device), None where it took none."""
    operand: Optional[Tensor] = None
    """``Want.gemm``: element values times block scales only (exact in x's dtype), in the transformed
    domain with ``transforms_operand``."""
    tensor_scale: Optional[Tensor] = None
    """``Want.gemm``: the float32 per-tensor factor of the accumulator; None where the format has none."""
    amax: Optional[Tensor] = None
    """``Want.amax``: x's own ``amax_of`` along the axis."""
    cross: Optional[Quantization] = None
    """``Want.both_axes``: the operand along the other of x's last two axes."""
