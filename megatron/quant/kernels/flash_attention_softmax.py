"""The attention softmax that the quantized flash attention kernel (``flash_attention``) and the unfused
quantized path share, defined to the bit: where P is quantized, the kernel can only match the unfused
path if both compute the same P before rounding it, and torch.softmax's exp (a vectorised approximation
on a CPU, CUDA's own on a GPU) and its sum order (vector lanes) are neither written down nor reproducible
in Triton. So both compute, in float32, with every operation rounded once (no fused multiply-add):

- exp by ``defined_exp``: Cody-Waite reduction by ln 2, a degree-7 Taylor polynomial on
  [-ln 2 / 2, ln 2 / 2] (Horner), times an exact power of two; within 2 ulp of exp (a test holds it);
- the row max m and sum l in one pass over blocks of ``KEY_BLOCK`` keys, first to last, as a flash
  kernel's online softmax (``row_stats``): m' = max(m, the block's max), then
  l = l * exp(m - m') + the block's exp(s - m') folded pairwise (first half plus second half, down to one);
- P = exp(s - m) / l, divided (correctly rounded), then stored in the scores' dtype.

Its backward is the softmax's, dS = P * (dP - D) with D = ``row_sum``(dP * P): the blocks folded
pairwise, their sums added first to last;
masked scores get a zero gradient, as megatron-core's mask does. It differs from torch.softmax by a
few float32 ulps (``tests/kernels/test_flash_attention.py`` states how many). Nothing here imports Triton.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.quant.formats.bits import exp2_int

KEY_BLOCK = 64  # keys a row sum folds pairwise: the kernel's key tile
# The constants as float32 values (written out, so torch and Triton multiply by the same numbers).
LOG2E = 1.4426950216293335
LN2_HI = 0.693359375  # ln 2 in 9 bits: k * LN2_HI is exact for |k| < 2**15
LN2_LO = -0.00021219444170128554  # ln 2 - LN2_HI
EXP_FLOOR = -104.0  # exp below it is 0 in float32 (and 2**k stays in exp2_int's range)
TAYLOR = (0.00019841270113829523, 0.0013888889225199819, 0.008333333767950535, 0.0416666679084301,
          0.1666666716337204, 0.5, 1.0, 1.0)  # 1/7!, 1/6!, ..., 1/0! in float32: Horner's order


def defined_exp(x: Tensor) -> Tensor:
    """exp of float32 x <= 0 as the kernel computes it (the module docstring); -inf gives 0."""
    x = torch.clamp(x, min=EXP_FLOOR)
    k = torch.floor(x * LOG2E + 0.5)
    r = (x - k * LN2_HI) - k * LN2_LO
    poly = torch.full_like(r, TAYLOR[0])
    for c in TAYLOR[1:]:
        poly = poly * r + c
    return poly * exp2_int(k.to(torch.int32))


def _blocks(t: Tensor, fill: float) -> Tensor:
    """t [..., n] as [..., blocks, KEY_BLOCK], the last block padded with ``fill``."""
    n = t.shape[-1]
    padded = -(-n // KEY_BLOCK) * KEY_BLOCK
    return torch.nn.functional.pad(t, (0, padded - n), value=fill).unflatten(-1, (padded // KEY_BLOCK, KEY_BLOCK))


def _fold(t: Tensor) -> Tensor:
    """Each block [..., KEY_BLOCK] summed pairwise: first half plus second half, down to one."""
    width = t.shape[-1]
    while width > 1:
        width //= 2
        t = t[..., :width] + t[..., width:]
    return t[..., 0]


def row_sum(t: Tensor) -> Tensor:
    """Sum of float32 t along its last dimension in the kernel's order (the module docstring), keepdim."""
    blocks = _fold(_blocks(t, 0.0))
    total = blocks[..., :1]
    for j in range(1, blocks.shape[-1]):
        total = total + blocks[..., j:j + 1]
    return total


def row_stats(scores: Tensor) -> tuple[Tensor, Tensor]:
    """(row max, row sum of exp(scores - max)) of float32 scores (-inf: hidden) in one pass over the key
    blocks, rescaling the sum as the max grows (the module docstring), keepdim."""
    blocks = _blocks(scores, float("-inf"))
    m = torch.full_like(blocks[..., 0, :1], float("-inf"))
    total = torch.zeros_like(m)
    for j in range(blocks.shape[-2]):
        block = blocks[..., j, :]
        new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = new.masked_fill(new == float("-inf"), 0.0)
        total = total * defined_exp(m - shift) + _fold(defined_exp(block - shift)).unsqueeze(-1)
        m = new
    return m, total


def causal_mask(sq: int, sk: int, device: torch.device) -> Tensor:
    """True where key j is hidden from query i (j > i), as megatron-core's default causal mask."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def softmax_forward(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """float32 P of float32 scores [..., sq, sk] (``mask``: True hides a key)."""
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    m, total = row_stats(scores)
    return torch.div(defined_exp(scores - m), total)


def softmax_backward(probs: Tensor, grad: Tensor, mask: Optional[Tensor]) -> Tensor:
    """float32 dS of float32 P and dP (the softmax's backward in the kernel's order)."""
    grad_scores = probs * (grad - row_sum(grad * probs))
    return grad_scores if mask is None else grad_scores.masked_fill(mask, 0.0)


class DefinedSoftmax(torch.autograd.Function):
    """P = softmax(scores) over the last dimension in float32, returned in the scores' dtype (as
    megatron-core's softmax in fp32); ``causal``: key j > query i masked."""

    @staticmethod
    def forward(ctx, scores: Tensor, causal: bool) -> Tensor:
        mask = causal_mask(scores.shape[-2], scores.shape[-1], scores.device) if causal else None
        probs = softmax_forward(scores.float(), mask)
        ctx.causal = causal
        ctx.save_for_backward(probs)
        return probs.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (probs,) = ctx.saved_tensors
        mask = causal_mask(probs.shape[-2], probs.shape[-1], probs.device) if ctx.causal else None
        return softmax_backward(probs, grad.float(), mask).to(grad.dtype), None
