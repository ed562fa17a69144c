"""The GEMM of two fake-quantized operands, as a scaled low-precision GEMM computes it: the operands'
products summed in FP32, the per-tensor scales applied to that FP32 result, one rounding to the
operands' dtype.

The operands hold low-precision values (FP8, FP4 elements, block scales folded in) in bf16, fp16 or
fp32, so every product is exact in FP32. Where torch has a GEMM of bf16/fp16 inputs with an FP32
output (``mm``/``bmm`` with ``out_dtype``: CUDA, and the meta device), that is the product: tensor-core
speed, the sums in FP32. Elsewhere (CPU) the operands are widened to FP32 first, the same sums. An FP32
GEMM of widened operands on a GPU would run at FP32's rate, several times slower than the bf16 GEMM
it stands for.

A GEMM may instead add its products as a Hopper FP8 tensor core does (``HopperAccumulator``: the
recipe's ``accumulate``, ``formats.accumulation``): its FP32 accumulator replaces the exact sums, the
scales and the rounding to the output dtype following as before (the tensor core's epilogue).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Union

import torch
from torch import Tensor

from megatron.quant.formats.accumulation import FP8Kind, Operands, hopper_accumulate
from megatron.quant.layers.operand import Quantized

# inputs torch multiplies into an FP32 output without widening them (mm/bmm with out_dtype)
NARROW = (torch.bfloat16, torch.float16)
OUT_DTYPE_DEVICES = ("cuda", "meta")


@dataclass(frozen=True)
class HopperAccumulator:
    """The FP32 accumulator of a Hopper FP8 GEMM (``formats.accumulation``), fast or promoted, for
    operands holding FP8 values of ``kinds`` (a's, b's)."""

    fast: bool
    kinds: tuple[FP8Kind, FP8Kind]

    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        """``matmul(a, b, torch.float32)`` for a (..., k) @ (k, n), the products added as the tensor core
        does: on a Hopper GPU by the tensor core itself (``torch._scaled_mm``, unit scales) where its
        shapes allow, else by the model (on a GPU its Triton kernel, ``kernels.accumulate``)."""
        if a.numel() == 0 or b.numel() == 0:  # no tokens (an expert routed none), or K = 0: nothing to add
            return torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float32, device=a.device)
        a2 = a.reshape(-1, a.shape[-1])
        if on_hopper(a2) and _fits(a2, b):
            acc = self._on_tensor_core(a2, b)
        elif a2.is_cuda:  # another GPU, or shapes cuBLAS's FP8 GEMM does not take: the model's kernel
            from megatron.quant.kernels.accumulate import hopper_accumulate_kernel

            acc = hopper_accumulate_kernel(a2, b.t(), self.kinds, self.fast)
        else:
            acc = hopper_accumulate(Operands(a2, b.t(), *self.kinds), self.fast)
        return acc.reshape(*a.shape[:-1], b.shape[-1])

    def _on_tensor_core(self, a: Tensor, b: Tensor) -> Tensor:
        one = torch.ones((), dtype=torch.float32, device=a.device)
        fp8_a, fp8_b = (a.to(FP8_DTYPES[self.kinds[0]]).contiguous(),
                        b.t().to(FP8_DTYPES[self.kinds[1]]).contiguous().t())  # b column-major, as cuBLAS takes it
        return torch._scaled_mm(fp8_a, fp8_b, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                use_fast_accum=self.fast)


FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def cpu_accumulation_notice(accumulations: Iterable[Mapping[str, str]], cuda: bool) -> Optional[str]:
    """The start line's notice for a run on the CPU whose GEMMs add their products as a Hopper FP8 tensor
    core does (``accumulations``: each recipe's GEMM -> mode): the model runs, what it costs, how to sum
    exactly instead; None on a GPU or where every GEMM sums exactly."""
    modes = {f"{gemm} {mode}" for each in accumulations for gemm, mode in each.items() if mode != "exact"}
    if cuda or not modes:
        return None
    return (f"notice: the FP8 GEMMs add their products as a Hopper tensor core does ({', '.join(sorted(modes))}; "
            f"the te-fp8 presets' default), modelled bit for bit on the CPU: each such GEMM takes tens of times an "
            f"exact one, after a compilation of seconds to a minute; exact FP32 sums: CUSTOM_QUANT_ACCUMULATE=exact")


def on_hopper(x: Tensor) -> bool:
    """x lives on a Hopper GPU (sm_90), whose FP8 tensor cores the accumulation model describes."""
    return x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)


def _fits(a: Tensor, b: Tensor) -> bool:
    """``torch._scaled_mm`` takes dimensions that are multiples of 16."""
    return all(size % 16 == 0 for size in (*a.shape, b.shape[1]))


Sums = Union[torch.dtype, HopperAccumulator, None]
"""How a GEMM adds its products: in its operands' dtype (None), into a dtype, or an accumulator model."""
Product = Callable[[Tensor, Tensor, Sums], Tensor]


def matmul(a: Tensor, b: Tensor, out_dtype: Sums = None) -> Tensor:
    """``torch.matmul(a, b)`` for a (..., k) @ (k, n) or a batched (B, m, k) @ (B, k, n); with
    ``out_dtype`` float32 the sums of the products in FP32, returned unrounded; with a
    ``HopperAccumulator`` (2-D b) that accumulator, in FP32."""
    if isinstance(out_dtype, HopperAccumulator):
        return out_dtype(a, b)
    if out_dtype is None:
        return torch.matmul(a, b)
    if a.dtype in NARROW and b.dtype == a.dtype and a.device.type in OUT_DTYPE_DEVICES:
        if b.dim() == 2:
            flat = torch.mm(a.reshape(-1, a.shape[-1]), b, out_dtype=out_dtype)
            return flat.reshape(*a.shape[:-1], b.shape[-1])
        if a.dim() == 3 and b.dim() == 3:
            return torch.bmm(a, b, out_dtype=out_dtype)
    return torch.matmul(a.to(out_dtype), b.to(out_dtype))


def scaled_product(product: Product, a: Quantized, b: Quantized, out_dtype: Optional[torch.dtype] = None,
                   accumulator: Optional[HopperAccumulator] = None) -> Tensor:
    """``product(a, b, None)`` with the operands' per-tensor scales applied to the FP32 result
    (``product(a, b, torch.float32)``), then rounded once to ``out_dtype`` (default: the operands'
    dtype), as a scaled low-precision GEMM does. Without scales and in the operands' dtype it is
    exactly ``product`` (stock megatron-core arithmetic); with ``out_dtype`` float32 nothing is
    rounded to the operands' dtype (a GEMM that accumulates into an FP32 buffer). ``accumulator``:
    the FP32 result is that accumulator's instead of the exact sums."""
    dtype = out_dtype or a.values.dtype
    scales = [s for s in (a.tensor_scale, b.tensor_scale) if s is not None]
    if not scales and accumulator is None:
        return product(a.values, b.values, None if dtype == a.values.dtype else dtype)
    result = product(a.values, b.values, accumulator or torch.float32)
    if scales:  # alpha = RN32(scale_a * scale_b), one rounding of the product (the tensor core's epilogue)
        result = result.mul_(scales[0] if len(scales) == 1 else scales[0] * scales[1])
    return result.to(dtype)
