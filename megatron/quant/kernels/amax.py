"""The per-tensor amax in one read: ``formats.base.abs_max`` (what per-tensor scales, NVFP4's FP32
tensor scale and delayed scaling's history take) as a Triton kernel. Each program writes its max
|x| over the non-NaN elements and its NaN count; the rows are folded on the device. A maximum does
not depend on the order of the reduction, so the result is the torch path's bit for bit."""
from __future__ import annotations

import math

import triton
import triton.language as tl
from torch import Tensor

from .elementwise import load
from .launch import launch_options, program_elements
from .stats import abs_max_rows, fold_abs_max, write_abs_max

BLOCK = 4096


@triton.jit
def _amax_kernel(x_ptr, rows_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    write_abs_max(rows_ptr, load(x_ptr + offsets, mask), mask)


def abs_max(x: Tensor, skip_nan: bool) -> Tensor:
    """max |x| as a 0-d tensor of x's dtype (``formats.base.abs_max``): NaN when x holds a NaN,
    unless ``skip_nan``. x: a non-empty float32/bf16/fp16 tensor the kernels serve."""
    x = x.contiguous()
    block = program_elements(BLOCK)
    programs = math.ceil(x.numel() / block)
    rows = abs_max_rows(programs, x.device)
    _amax_kernel[(programs,)](x, rows, x.numel(), BLOCK_SIZE=block, **launch_options(block))
    return fold_abs_max(rows, skip_nan).to(x.dtype)
