"""The autograd function of attention's fake-quantized batched GEMMs, the gradient capture and the recomputed backward.

The backward mirrors autograd's formulas for ``torch.baddbmm``/``torch.bmm``; where a backward
operand's format equals the forward's and gives the same result on any axis, the forward's
quantized copy is reused.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.formats.interface import QuantFormat
from megatron.quant.layers.operand import (
    NoiseScope,
    Quantized,
    check_gemm_transforms,
    quantize_both_axes,
    quantize_operand,
    reusable_amax,
    same_quantization,
)
from megatron.quant.layers.scaled_gemm import matmul, scaled_product
from megatron.quant.recipes import operands
from megatron.quant.recipes.operands import OperandSpec
from megatron.quant.tensor_saver import CaptureSite


def _unquantized(slot: str) -> OperandSpec:
    return OperandSpec(axis=next(s.axis for s in operands.BMM_SLOTS if s.name == slot))


@dataclass(frozen=True)
class BmmQuant:
    """Specs for C = alpha * A @ B (A [n, m, k], B [n, k, p]) and its two backward GEMMs, one field per
    ``recipes.operands.BMM_SLOTS`` entry (its block axis and GEMM come from there)."""

    a: OperandSpec = _unquantized("a")                  # forward: along k
    b: OperandSpec = _unquantized("b")
    grad_a_dc: OperandSpec = _unquantized("grad_a_dc")  # dA = dC B^T: along p
    grad_a_b: OperandSpec = _unquantized("grad_a_b")
    grad_b_a: OperandSpec = _unquantized("grad_b_a")    # dB = A^T dC: along m
    grad_b_dc: OperandSpec = _unquantized("grad_b_dc")

    @classmethod
    def from_formats(cls, formats: Mapping[str, Optional[QuantFormat]], keys: tuple[str, ...],
                     shard_dim: Optional[int] = 0) -> "BmmQuant":
        """``keys``: recipe keys in ``BMM_SLOTS`` order (``QK_OPERANDS``, ``PV_OPERANDS``);
        ``shard_dim``: the batch dimension of every operand, split across TP ranks by heads."""
        return cls(**{slot.name: OperandSpec(formats[key], slot.axis, key, shard_dim)
                      for slot, key in zip(operands.BMM_SLOTS, keys, strict=True)})

    def __post_init__(self) -> None:
        gemms: dict[str, list[OperandSpec]] = {}
        for slot in operands.BMM_SLOTS:
            gemms.setdefault(slot.gemm, []).append(getattr(self, slot.name))
        check_gemm_transforms(gemms)


def _bmm(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(a, b, out_dtype)


def _bmm_nt(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(a, b.transpose(1, 2), out_dtype)


def _bmm_tn(a: Tensor, b: Tensor, out_dtype: Optional[torch.dtype]) -> Tensor:
    return matmul(a.transpose(1, 2), b, out_dtype)


def _scaled(t: Tensor, alpha: Optional[float]) -> Tensor:
    return t if alpha is None else t * alpha  # as autograd's baddbmm backward (maybe_multiply)


@dataclass(frozen=True)
class BmmOperands:
    """What ``QuantBmmFunction`` needs besides A and B: the TP group for amaxes, the noise scope,
    the number of batch groups (``Shard.groups``), and forward operands quantized beforehand."""

    group: Optional[dist.ProcessGroup] = None
    noise: Optional[NoiseScope] = None
    groups: int = 1
    a: Optional[Quantized] = None
    b: Optional[Quantized] = None


class QuantBmmFunction(torch.autograd.Function):
    """``torch.baddbmm(empty, A, B, beta=0, alpha=alpha)`` (or ``torch.bmm`` when alpha is None)
    with fake-quantized operands; the backward mirrors autograd's formulas for those ops."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, alpha: Optional[float], quant: BmmQuant, given: BmmOperands) -> Tensor:
        ctx.alpha, ctx.quant, ctx.given = alpha, quant, replace(given, a=None, b=None)
        a_q = given.a or _quantize_bmm(a, quant.a, given)
        b_q = given.b or _quantize_bmm(b, quant.b, given)
        # Only the scale and amax are kept: the values travel in saved_tensors, the capture record not at all.
        ctx.a_quantized = replace(a_q, values=None, seen=None) if same_quantization(quant.a, quant.grad_b_a) else None
        ctx.b_quantized = replace(b_q, values=None, seen=None) if same_quantization(quant.b, quant.grad_a_b) else None
        ctx.amaxes = (reusable_amax(a_q, quant.a, quant.grad_b_a), reusable_amax(b_q, quant.b, quant.grad_a_b))
        ctx.save_for_backward(a_q.values if ctx.a_quantized else a, b_q.values if ctx.b_quantized else b)
        if alpha is None:
            return scaled_product(_bmm, a_q, b_q)
        if a_q.tensor_scale is None and b_q.tensor_scale is None:
            out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
            return torch.baddbmm(out, a_q.values, b_q.values, beta=0.0, alpha=alpha)
        return scaled_product(lambda x, y, dtype: matmul(x, y, dtype).mul_(alpha), a_q, b_q)

    @staticmethod
    def backward(ctx, grad_c: Tensor):
        a, b = ctx.saved_tensors
        q: BmmQuant = ctx.quant
        given: BmmOperands = ctx.given
        grad_a = grad_b = None
        dc_a = dc_b = None
        if all(ctx.needs_input_grad[:2]) and not same_quantization(q.grad_a_dc, q.grad_b_dc):
            # dC along p (for dA) and along m (for dB) from one read where a kernel does both.
            dc_b, dc_a = quantize_both_axes(grad_c, q.grad_b_dc, q.grad_a_dc, given.group, given.noise,
                                            groups=given.groups) or (None, None)
        if ctx.needs_input_grad[0]:
            if dc_a is None:
                dc_a = _quantize_bmm(grad_c, q.grad_a_dc, given)
            b_q = replace(ctx.b_quantized, values=b) if ctx.b_quantized else \
                _quantize_bmm(b, q.grad_a_b, given, ctx.amaxes[1])
            grad_a = _scaled(scaled_product(_bmm_nt, dc_a, b_q), ctx.alpha)
        if ctx.needs_input_grad[1]:
            a_q = replace(ctx.a_quantized, values=a) if ctx.a_quantized else \
                _quantize_bmm(a, q.grad_b_a, given, ctx.amaxes[0])
            if dc_b is None:
                dc_b = dc_a if dc_a is not None and same_quantization(q.grad_a_dc, q.grad_b_dc) else \
                    _quantize_bmm(grad_c, q.grad_b_dc, given,
                                  None if dc_a is None else reusable_amax(dc_a, q.grad_a_dc, q.grad_b_dc))
            grad_b = _scaled(scaled_product(_bmm_tn, a_q, dc_b), ctx.alpha)
        return grad_a, grad_b, None, None, None


def _quantize_bmm(x: Tensor, spec: OperandSpec, given: BmmOperands, amax: Optional[Tensor] = None) -> Quantized:
    return quantize_operand(x, spec, given.group, given.noise, amax=amax, groups=given.groups)


class CaptureGradients(torch.autograd.Function):
    """Identity whose backward hands the incoming gradients to the saver under ``names``."""

    @staticmethod
    def forward(ctx, site: CaptureSite, phase: str, names: tuple[str, ...], *tensors: Tensor):
        ctx.site, ctx.phase, ctx.names = site, phase, names
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        if tensor_saver.is_active():
            tensor_saver.capture(ctx.site, "backward", ctx.phase,
                                 {n: g for n, g in zip(ctx.names, grads) if g is not None})
        return (None, None, None) + grads


def recompute_backward(forward: Callable[..., Tensor], inputs: tuple[Tensor, ...], grad_output: Tensor
                       ) -> tuple[Optional[Tensor], ...]:
    """Gradients of ``forward(*inputs)`` by re-running it with autograd (flash-attention style)."""
    leaves = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
    with torch.enable_grad():
        out = forward(*leaves)
    wanted = [x for x in leaves if x.requires_grad]
    grads = iter(torch.autograd.grad(out, wanted, grad_output, allow_unused=True))
    return tuple(next(grads) if x.requires_grad else None for x in leaves)
