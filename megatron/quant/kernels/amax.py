"""The per-tensor amax in one read: ``formats.base.abs_max`` (what per-tensor scales, NVFP4's FP32
tensor scale and delayed scaling's history take) as a Triton kernel. Each program writes its max
|x| over the non-NaN elements and its NaN count; the rows are folded on the device. A maximum does
not depend on the order of the reduction, so the result is the torch path's bit for bit."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .elementwise import load
from .select import EXACT_ARITHMETIC, program_elements

BLOCK = 4096


@triton.jit
def _amax_kernel(x_ptr, rows_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = load(x_ptr + offsets, mask)  # 0 where masked: no effect on a max of magnitudes
    nan = x != x
    row = rows_ptr + tl.program_id(0).to(tl.int64) * 2
    tl.store(row, tl.max(tl.where(nan, 0.0, tl.abs(x)), axis=0))
    tl.store(row + 1, tl.sum((nan & mask).to(tl.int32), axis=0).to(tl.float32))


def abs_max(x: Tensor, skip_nan: bool) -> Tensor:
    """max |x| as a 0-d tensor of x's dtype (``formats.base.abs_max``): NaN when x holds a NaN,
    unless ``skip_nan``. x: a non-empty float32/bf16/fp16 tensor the kernels serve."""
    x = x.contiguous()
    block = program_elements(BLOCK)
    programs = math.ceil(x.numel() / block)
    rows = torch.empty((programs, 2), dtype=torch.float32, device=x.device)
    _amax_kernel[(programs,)](x, rows, x.numel(), BLOCK_SIZE=block, **EXACT_ARITHMETIC)
    return fold_abs_max(rows, skip_nan).to(x.dtype)


def fold_abs_max(rows: Tensor, skip_nan: bool) -> Tensor:
    """The amax from the programs' rows of (max |x| over non-NaN, NaN count)."""
    amax = rows[:, 0].amax()
    return amax if skip_nan else torch.where(rows[:, 1].sum() > 0, math.nan, amax)
