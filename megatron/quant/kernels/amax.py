"""The per-tensor amax in one read: ``formats.base.abs_max`` (what per-tensor scales, NVFP4's FP32
tensor scale and delayed scaling's history take) as a Triton kernel. Each program writes its max
|x| over the non-NaN elements and its NaN count; the rows are folded on the device, by torch or by the
quantizing kernel itself (``elementwise.tensor_scale``: at most ``MAX_ROWS`` rows of bits, each
program walking as many blocks as that takes). A maximum does not depend on the order of the
reduction, nor an integer count, so the result is the torch path's bit for bit."""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .elementwise import MAX_ROWS, fold_magnitudes, load, scale_of, store
from .launch import launch_options, program_elements
from .stats import abs_max_rows, fold_abs_max, write_abs_max

BLOCK = 4096
FOLD_ROWS = 1024  # rows ``_fold_kernel`` takes at a time


@triton.jit
def _amax_kernel(x_ptr, rows_ptr, n, BLOCK_SIZE: tl.constexpr, STRIDED: tl.constexpr, SKIP_NAN: tl.constexpr):
    """This program's row of ``write_abs_max``; with ``STRIDED`` instead, over every ``num_programs``-th
    block from its own, the bits of its max |x| (NaN where x holds one, unless ``SKIP_NAN``) as one
    int32: magnitudes order as their bits do, a NaN's above Inf's, so rows fold with an integer max."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = load(x_ptr + offsets, mask)
    if STRIDED:
        step = tl.num_programs(0).to(tl.int64) * BLOCK_SIZE
        top = magnitude_bits(x, SKIP_NAN)
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK_SIZE + step, n, step):
            more = load(x_ptr + start + tl.arange(0, BLOCK_SIZE), start + tl.arange(0, BLOCK_SIZE) < n)
            top = tl.maximum(top, magnitude_bits(more, SKIP_NAN))
        tl.store(rows_ptr + tl.program_id(0), tl.max(top, axis=None))
    else:
        write_abs_max(rows_ptr, x, mask)


@triton.jit
def magnitude_bits(x, SKIP_NAN: tl.constexpr):
    """The int32 bits of |x| (0 for NaN with ``SKIP_NAN``; a NaN's bits, above Inf's, without)."""
    magnitude = tl.abs(x)
    if SKIP_NAN:
        magnitude = tl.where(x != x, 0.0, magnitude)
    return magnitude.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _fold_kernel(rows_ptr, n_rows, out_ptr, SKIP_NAN: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """``stats.fold_abs_max`` on the device, one program: the max of the rows' magnitudes (each >= 0),
    NaN where a row counted a NaN (unless ``SKIP_NAN``), stored in out's dtype (exact: an element's)."""
    top = tl.zeros((BLOCK_SIZE,), tl.float32)
    nans = tl.zeros((BLOCK_SIZE,), tl.float32)
    for start in range(0, n_rows, BLOCK_SIZE):
        r = start + tl.arange(0, BLOCK_SIZE)
        top = tl.maximum(top, tl.load(rows_ptr + 2 * r, mask=r < n_rows, other=0.0))
        nans = nans + tl.load(rows_ptr + 2 * r + 1, mask=r < n_rows, other=0.0)
    amax = tl.max(top, axis=0)
    if not SKIP_NAN:
        amax = tl.where(tl.max(nans, axis=0) > 0, float("nan"), amax)
    store(out_ptr, amax, True)


@triton.jit
def tensor_scale_of(tensor_ptr, lines, line, valid, FOLD: tl.constexpr, decode_ptr, ELEMENT: tl.constexpr,
                    SCALE: tl.constexpr):
    """A block format's FP32 tensor scale at each block's ``line`` (0 but per row; ``valid``: the
    block is), as (global encode / element max, global decode, global encode, amax): read from the
    four rows of ``lines`` values at tensor_ptr (``blocks.TENSOR_ROWS``), or with ``FOLD`` computed
    from the ``lines`` rows of magnitude bits there (``abs_max_rows_of``) as ``formats.nvfp`` does, the
    first program writing the global decode to decode_ptr. Ones where the format has no tensor scale."""
    # One return a branch: the GPU compiler checks every return it reaches against the others.
    if SCALE.kind != 2:
        return 1.0, 1.0, 1.0, 1.0
    elif FOLD:
        amax = fold_magnitudes(tensor_ptr, lines, FOLD)
        encode, decode = scale_of(amax, SCALE.target, False)
        if tl.program_id(0) == 0:
            tl.store(decode_ptr, decode)
        return encode * (1.0 / ELEMENT.max_value), decode, encode, amax
    else:
        return (tl.load(tensor_ptr + line, mask=valid, other=1.0),
                tl.load(tensor_ptr + lines + line, mask=valid, other=1.0),
                tl.load(tensor_ptr + 2 * lines + line, mask=valid, other=1.0),
                tl.load(tensor_ptr + 3 * lines + line, mask=valid, other=1.0))


def tensor_scale_args(x: Tensor, tensor: Optional[Tensor], decode: Optional[Tensor]) -> tuple:
    """``tensor_scale_of``'s arguments (a kernel's ``tensor_ptr, lines, FOLD, decode_ptr``): ``tensor``'s
    ``TENSOR_ROWS`` rows of values, or with ``decode`` (a 0-d float32 output, the global decode written
    there) ``tensor`` holds x's amax rows (``abs_max_rows_of``) and the kernel folds them; x: a placeholder."""
    return (x if tensor is None else tensor, 1 if tensor is None else tensor.shape[-1],
            0 if decode is None else MAX_ROWS, x if decode is None else decode)


def abs_max(x: Tensor, skip_nan: bool) -> Tensor:
    """max |x| as a 0-d tensor of x's dtype (``formats.base.abs_max``): NaN when x holds a NaN,
    unless ``skip_nan``. x: a non-empty float32/bf16/fp16 tensor the kernels serve."""
    x = x.contiguous()
    block = program_elements(BLOCK)
    programs = math.ceil(x.numel() / block)
    rows = abs_max_rows(programs, x.device)
    _amax_kernel[(programs,)](x, rows, x.numel(), BLOCK_SIZE=block, STRIDED=False, SKIP_NAN=False,
                              **launch_options(block))
    return fold_abs_max(rows, skip_nan).to(x.dtype)


def fold_rows(rows: Tensor, skip_nan: bool, dtype: torch.dtype) -> Tensor:
    """The 0-d amax (``dtype``) of ``stats.write_abs_max``'s rows, folded on the device in one launch."""
    out = torch.empty((), dtype=dtype, device=rows.device)
    _fold_kernel[(1,)](rows, rows.shape[0], out, SKIP_NAN=skip_nan, BLOCK_SIZE=FOLD_ROWS, **launch_options(FOLD_ROWS))
    return out


def abs_max_rows_of(x: Tensor, skip_nan: bool) -> Tensor:
    """At most ``MAX_ROWS`` int32 rows of magnitude bits (``_amax_kernel``'s ``STRIDED``) over contiguous,
    non-empty x (float32/bf16/fp16), for a kernel to fold with an integer max: one launch."""
    block = program_elements(BLOCK)
    programs = min(math.ceil(x.numel() / block), MAX_ROWS)
    rows = torch.empty(programs, dtype=torch.int32, device=x.device)
    _amax_kernel[(programs,)](x, rows, x.numel(), BLOCK_SIZE=block, STRIDED=True, SKIP_NAN=skip_nan,
                              **launch_options(block))
    return rows
