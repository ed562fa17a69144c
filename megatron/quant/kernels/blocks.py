"""Triton kernel of the block-scaled formats, by their ``KernelContract``'s block scale: E8M0 (MX,
``formats.mx``, every scale mode), FP32 (FP8 blockwise, ``formats.fp8_blocks``, with or without
power-of-two scales) and a grid's value under a tensor scale (NVFP4 and NVFP6, ``formats.nvfp``:
E4M3 block scales under an FP32 tensor scale, TE's arithmetic);
blocks along any axis (first, middle, last; a ragged last block counts as shorter) or square
tiles of the last two dimensions, round to nearest or stochastic. One pass: each program loads whole blocks,
reduces their amax, and writes the quantized values.

x is viewed as (before, length, after) with the blocks along ``length``; a program holds a
(block position, block) tile, so the amax is a reduction over its first dimension. Inf or NaN
in a block makes the block NaN, as the torch path does.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from megatron.quant.formats.contract import KernelContract
from megatron.quant.formats.hadamard import signs_on
from megatron.quant.formats.rounding import DRAW_BITS

from . import constants
from .amax import tensor_scale_args, tensor_scale_of
from .block_scales import fp8_block_scales, mx_scales, nan_where
from .constants import Layout
from .elementwise import load, round_grid, store, stored
from .launch import launch_options, program_elements
from .noise import global_index, noise_args, uniform
from .stats import NO_ROW, NONE, abs_max_rows, fold_abs_max, stats_row, stats_rows, write_abs_max, write_stats

ELEMENTS_PER_PROGRAM = 1024
FP32_MAX = tl.constexpr(3.4028234663852886e38)  # TE's bound on an encode factor (``formats.nvfp``)
TENSOR_ROWS = 4  # a tensor scale's rows: global encode / element max, global decode, global encode, amax


@triton.jit
def block_offsets(c, k, n_blocks_total, length, after, n_blocks, rows, cols, LAYOUT: tl.constexpr):
    """(offsets, valid) of a [block position, block] tile: block ids ``c``, positions ``k``. The block
    ids' divisions in int32 unless ``LAYOUT.wide`` (an int64 division is a call of ~90 instructions)."""
    valid_block = c < n_blocks_total
    if not LAYOUT.wide:  # every id a program holds is below 2**31 (``block_walk``)
        c = c.to(tl.int32)
    B = LAYOUT.block
    SIDE = LAYOUT.side
    if LAYOUT.tiled:  # c enumerates (matrix, tile row, tile column); k runs row by row through a SIDE x SIDE tile
        per_row = (cols + SIDE - 1) // SIDE
        per_matrix = ((rows + SIDE - 1) // SIDE) * per_row
        t = c % per_matrix
        across, down = k[:, None] // SIDE, k[:, None] % SIDE
        if LAYOUT.transposed:  # W^T's tile rows are W's columns
            across, down = down, across
        row = (t // per_row) * SIDE + across
        col = (t % per_row) * SIDE + down
        valid = (k[:, None] < B) & (row < rows) & (col < cols) & valid_block
        offsets = (c // per_matrix).to(tl.int64) * rows * cols + row.to(tl.int64) * cols + col
    else:  # c enumerates (before, block, after) with after fastest
        a = c % after
        r = c // after
        position = (r % n_blocks) * B + k[:, None]
        valid = (k[:, None] < B) & (position < length) & valid_block
        offsets = (r // n_blocks).to(tl.int64) * length * after + position.to(tl.int64) * after + a
    return offsets, valid


@triton.jit
def block_amax(x, AXIS: tl.constexpr, NONFINITE_TE: tl.constexpr):
    """(amax, nonfinite) of the blocks along ``AXIS`` of a 2-D tile, kept 2-D for broadcasting.
    te: the amax skips NaN (fmaxf) and may be Inf (``nonfinite`` unused); propagate: a block holding
    Inf or NaN turns NaN (``nonfinite``), so only finite blocks' amaxes matter: the largest magnitude's
    bits (an integer max, which orders every finite value below Inf and Inf below NaN), two integer
    operations an element, are a finite block's amax and Inf's or NaN's bits for the others."""
    if NONFINITE_TE:
        amax = tl.max(tl.where(x != x, 0.0, tl.abs(x)), axis=AXIS, keep_dims=True)
        return amax, amax != amax
    magnitude = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=AXIS, keep_dims=True)
    return magnitude.to(tl.float32, bitcast=True), magnitude >= 0x7F800000


@triton.jit
def block_values(x, amax, nonfinite, u, multiplier, tensor_decode, tensor_encode, tensor_amax, ELEMENT: tl.constexpr,
                 SCALE: tl.constexpr, SCALE_GRID: tl.constexpr, STOCHASTIC: tl.constexpr, SPLIT: tl.constexpr,
                 TILED: tl.constexpr):
    """(x quantized with its blocks' amaxes, the blocks' scales as the torch path returns them):
    the per-block scale by ``SCALE`` (``constants.BlockScale``: E8M0, FP32, or a ``SCALE_GRID`` value under
    the tensor scale), the elements rounded onto ``ELEMENT`` (``u``: noise), decoded. The scale is
    what x was divided by, NaN for a block the format turns NaN. Under a tensor scale, ``multiplier`` (global
    encode / element max) to ``tensor_amax`` are the blocks' (``tensor_scale_of``); ``TILED``: the blocks
    are 16 x 16 tiles (4over6's error order)."""
    if SCALE.kind == 0:
        encode, decode = mx_scales(amax, SCALE)
        decode = nan_where(nonfinite, decode, SCALE.nonfinite_te)
        scale = decode
    elif SCALE.kind == 1:
        encode, decode = fp8_block_scales(amax, ELEMENT.max_value, SCALE.power_of_two, SCALE.value_for_inf)
        decode = nan_where(nonfinite, decode, SCALE.nonfinite_te)
        scale = decode
    if SCALE.kind == 2 and SCALE.four_over_six:
        decode, y = four_over_six(x, amax, tensor_encode, tensor_decode, tensor_amax, ELEMENT, SCALE, SCALE_GRID,
                                  TILED)
        decode = nan_where(nonfinite, decode, SCALE.nonfinite_te)
        scale = decode * tensor_decode
        y = y * decode
    else:
        if SCALE.kind == 2:  # the block's scale, to nearest; a block whose scale rounds to zero quantizes to zero
            decode = nan_where(nonfinite, round_grid(amax * multiplier, amax, amax, SCALE_GRID, 0), SCALE.nonfinite_te)
            scale = decode * tensor_decode
            encode = tl.minimum(tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale), FP32_MAX)
        scaled = x * encode
        if SCALE.kind == 2:
            scaled = tl.where(scale == 0.0, 0.0, scaled)
        y = round_grid(scaled, u, x, ELEMENT, STOCHASTIC) * decode
    if SCALE.kind == 2 and not SPLIT:
        y = y * tensor_decode
    return y, scale


@triton.jit
def four_over_six(x, amax, tensor_encode, tensor_decode, tensor_amax, ELEMENT: tl.constexpr, SCALE: tl.constexpr,
                  SCALE_GRID: tl.constexpr, TILED: tl.constexpr):
    """(E4M3 block scales, elements) of NVFP4's 4over6 (``formats.nvfp``): of the map-to-4 and map-to-6
    candidates, the one whose summed error is lower (ties: map-to-6)."""
    base = tl.math.div_rn(amax, tl.full(amax.shape, ELEMENT.max_value, tl.float32)) * tensor_encode
    decode4 = round_grid(base * 1.5, base, base, SCALE_GRID, 0)
    decode6 = round_grid(base, base, base, SCALE_GRID, 0)
    elements4, error4 = four_over_six_candidate(x, decode4, tensor_decode, tensor_amax, ELEMENT, SCALE, TILED)
    elements6, error6 = four_over_six_candidate(x, decode6, tensor_decode, tensor_amax, ELEMENT, SCALE, TILED)
    map_to_four = error4 < error6
    return tl.where(map_to_four, decode4, decode6), tl.where(map_to_four, elements4, elements6)


@triton.jit
def four_over_six_candidate(x, decode, tensor_decode, tensor_amax, ELEMENT: tl.constexpr, SCALE: tl.constexpr,
                            TILED: tl.constexpr):
    """(elements, the blocks' summed error) of one 4over6 candidate: its values in TE's error domain,
    ((element * decode) * amax_tensor) / target, against x, by MAE (1) or MSE (2)."""
    encode = tl.minimum(tl.math.div_rn(tl.full(decode.shape, 1.0, tl.float32), decode * tensor_decode), FP32_MAX)
    elements = round_grid(x * encode, x, x, ELEMENT, 0)
    values = tl.math.div_rn((elements * decode) * tensor_amax, tl.full(x.shape, SCALE.target, tl.float32))
    diff = values - x
    if SCALE.four_over_six == 1:
        error = tl.abs(diff)
    else:
        error = diff * diff
    return elements, block_error(error, TILED)


@triton.jit
def block_error(error, TILED: tl.constexpr):
    """Each block's (a column of the tile) summed error in TE's order, as a [1, columns] row: along a
    1 x 16 block first to last; in a 16 x 16 tile each row left to right, then the 16 row sums pairwise
    (``formats.nvfp.NVFPFormat._block_error``). One element a time: a masked sum adds only zeros to it."""
    P: tl.constexpr = error.shape[0]
    C: tl.constexpr = error.shape[1]
    if TILED:
        cells = tl.reshape(error, (16, 16, C))  # (row, column): tiles run row by row
        column = tl.arange(0, 16)[None, :, None]
        rows = tl.sum(tl.where(column == 0, cells, 0.0), axis=1)
        for j in tl.static_range(1, 16):
            rows = rows + tl.sum(tl.where(column == j, cells, 0.0), axis=1)
        return fold_half(fold_half(fold_half(fold_half(rows))))
    k = tl.arange(0, P)[:, None]
    total = tl.sum(tl.where(k == 0, error, 0.0), axis=0, keep_dims=True)
    for j in tl.static_range(1, P):
        total = total + tl.sum(tl.where(k == j, error, 0.0), axis=0, keep_dims=True)
    return total


@triton.jit
def fold_half(t):
    """First half plus second half of an (N, columns) tile's rows."""
    N: tl.constexpr = t.shape[0]
    C: tl.constexpr = t.shape[1]
    first, second = tl.split(tl.permute(tl.reshape(t, (2, N // 2, C)), (1, 2, 0)))
    return first + second


@triton.jit
def walsh_hadamard(t, LOG2N: tl.constexpr):
    """t @ H_N along axis 0 of an (N, columns) tile by the butterfly, stage by stage as
    ``formats.hadamard.walsh_hadamard`` adds and subtracts (unnormalised)."""
    N: tl.constexpr = t.shape[0]
    C: tl.constexpr = t.shape[1]
    for stage in tl.static_range(LOG2N):
        pairs = tl.permute(tl.reshape(t, (N // (2 << stage), 2, 1 << stage, C)), (0, 2, 3, 1))
        a, b = tl.split(pairs)
        t = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2)), (N, C))
    return t


@triton.jit(do_not_specialize=["key_low", "key_high"])
def _block_kernel(x_ptr, out_ptr, tensor_ptr, lines, FOLD: tl.constexpr, decode_ptr, n_blocks_total, length, after,
                  n_blocks, rows, cols, key_low, key_high, g_after, g_local, g_rank_offset, g_row_stride,
                  LAYOUT: tl.constexpr, ELEMENT: tl.constexpr, SCALE: tl.constexpr, SCALE_GRID: tl.constexpr,
                  STOCHASTIC: tl.constexpr, SPLIT: tl.constexpr, scales_ptr, rows_ptr, STATS: tl.constexpr,
                  BOUND: tl.constexpr, INCLUSIVE: tl.constexpr, ROW: tl.constexpr, LOG2: tl.constexpr, signs_ptr,
                  RHT: tl.constexpr, AMAX_ONLY: tl.constexpr):
    """Blocks ``c`` of a program (``LAYOUT``: ``constants.Layout``), quantized into out (``ELEMENT``,
    ``SCALE``: ``block_values``); with ``STATS`` also their scales (one per block, in block order) and
    the program's row of statistics (``stats.write_stats``). ``RHT`` (``constants.Rht``; log2 of the
    group size, which is the block size): each block is replaced by its random Hadamard transform
    (``formats.hadamard``: signs, butterfly, norm) before quantization, and with ``inverse`` the
    quantized block is transformed back before it is stored. ``AMAX_ONLY``: quantize nothing; write the
    program's (max |x| over non-NaN, NaN count) to rows_ptr (``stats.write_abs_max``: the per-tensor
    amax of the transformed tensor). ``FOLD``, ``decode_ptr``: ``tensor_scale_of``."""
    c = tl.program_id(0).to(tl.int64) * LAYOUT.columns + tl.arange(0, LAYOUT.columns)[None, :]
    k = tl.arange(0, LAYOUT.padded)
    offsets, valid = block_offsets(c, k, n_blocks_total, length, after, n_blocks, rows, cols, LAYOUT)
    x = load(x_ptr + offsets, valid)
    xt = x
    if RHT.log2:
        signs = tl.load(signs_ptr + k)[:, None]
        xt = walsh_hadamard(x * signs, RHT.log2) * RHT.norm
    if AMAX_ONLY:
        write_abs_max(rows_ptr, xt, valid)
    else:
        amax, nonfinite = block_amax(xt, 0, SCALE.nonfinite_te)
        u = xt
        if STOCHASTIC:
            u = uniform(global_index(offsets, g_after, g_local, g_rank_offset, g_row_stride), key_low, key_high)
        line = c * 0
        if SCALE.per_row:  # the line of x along the axis through block c: (before, after)
            line = ((c // after) // n_blocks) * after + c % after
        multiplier, tensor_decode, tensor_encode, tensor_amax = tensor_scale_of(
            tensor_ptr, lines, line, c < n_blocks_total, FOLD, decode_ptr, ELEMENT, SCALE)
        y, scale = block_values(xt, amax, nonfinite, u, multiplier, tensor_decode, tensor_encode, tensor_amax, ELEMENT,
                                SCALE, SCALE_GRID, STOCHASTIC, SPLIT, LAYOUT.tiled)
        if RHT.inverse:
            y = walsh_hadamard(y, RHT.log2) * RHT.norm * signs
        store(out_ptr + offsets, y, valid)
        if STATS:
            tl.store(scales_ptr + c, scale, mask=c < n_blocks_total)
            write_stats(rows_ptr + tl.program_id(0).to(tl.int64) * ROW.width, x, stored(y, out_ptr), xt, scale, valid,
                        BOUND, INCLUSIVE, STATS, True, LOG2, ROW)


@triton.jit(do_not_specialize=["key0_low", "key0_high", "key1_low", "key1_high"])
def _dual_kernel(x_ptr, out0_ptr, out1_ptr, tensor_ptr, lines, FOLD: tl.constexpr, decode_ptr, rows, cols, key0_low,
                 key0_high, after0, local0, offset0, stride0, key1_low, key1_high, after1, local1, offset1, stride1,
                 B: tl.constexpr, BP: tl.constexpr, ELEMENT: tl.constexpr, SCALE: tl.constexpr,
                 SCALE_GRID: tl.constexpr, STOCHASTIC: tl.constexpr, SPLIT: tl.constexpr):
    """Matrices (rows, cols) quantized along their rows (into out0) and columns (out1) from one read
    of each B x B tile; programs run through the tiles of one matrix, then the next (``tensor_ptr`` to
    ``decode_ptr``: ``tensor_scale_of``'s)."""
    per_row = (cols + B - 1) // B
    per_matrix = ((rows + B - 1) // B) * per_row
    matrix = tl.program_id(0).to(tl.int64) // per_matrix
    tile = tl.program_id(0) % per_matrix
    i = tl.arange(0, BP)[:, None]
    j = tl.arange(0, BP)[None, :]
    r = (tile // per_row) * B + i
    c = (tile % per_row) * B + j
    valid = (i < B) & (j < B) & (r < rows) & (c < cols)
    offsets = matrix * rows * cols + r.to(tl.int64) * cols + c
    x = load(x_ptr + offsets, valid)
    u0 = x
    u1 = x
    if STOCHASTIC:
        u0 = uniform(global_index(offsets, after0, local0, offset0, stride0), key0_low, key0_high)
        u1 = uniform(global_index(offsets, after1, local1, offset1, stride1), key1_low, key1_high)
    line = tl.zeros((1, 1), tl.int32)  # one tensor scale (``KernelContract.dual_axis``)
    multiplier, tensor_decode, tensor_encode, tensor_amax = tensor_scale_of(tensor_ptr, lines, line, line == 0, FOLD,
                                                                            decode_ptr, ELEMENT, SCALE)
    amax, nonfinite = block_amax(x, 0, SCALE.nonfinite_te)
    y, _ = block_values(x, amax, nonfinite, u0, multiplier, tensor_decode, tensor_encode, tensor_amax, ELEMENT, SCALE,
                        SCALE_GRID, STOCHASTIC, SPLIT, False)
    store(out0_ptr + offsets, y, valid)
    amax, nonfinite = block_amax(x, 1, SCALE.nonfinite_te)
    y, _ = block_values(x, amax, nonfinite, u1, multiplier, tensor_decode, tensor_encode, tensor_amax, ELEMENT, SCALE,
                        SCALE_GRID, STOCHASTIC, SPLIT, False)
    store(out1_ptr + offsets, y, valid)


def launch_blocks(x, out, contract: KernelContract, axis: int, noise: tuple, tensor: Optional[Tensor] = None,
                  split: bool = False, stats: int = NONE, transform: Optional[str] = None,
                  decode: Optional[Tensor] = None) -> Optional[tuple[Tensor, Tensor]]:
    """Quantize contiguous x with a block format's ``contract`` (blocks along non-negative ``axis``,
    or its tiles) into out. With a tensor scale (NVFP): ``tensor`` holds ``TENSOR_ROWS`` rows (global
    encode / element max, global decode, global encode, amax) of one value, or one per row of x along
    ``axis`` (``per_row``), or with ``decode`` x's amax rows (``amax.tensor_scale_args``); ``split``: the
    values leave the global decode out. ``stats`` (``stats.COUNTS`` or ``FULL``): also return (the
    blocks' scales in block order, the programs' rows of statistics). ``transform``: the contract's
    Hadamard transform applied by the kernel (``fused_transform``), out holding the quantized values in
    the transformed domain ("forward") or transformed back ("inverse"); None: x is quantized as it is."""
    shape, layout = block_walk(x, contract, axis)
    programs = triton.cdiv(shape[0], layout.columns)
    scales, stats_out = ((torch.empty(shape[0], dtype=torch.float32, device=x.device),
                          stats_rows(programs, stats, x.device)) if stats else (x, x))
    _block_kernel[(programs,)](
        x, out, *tensor_scale_args(x, tensor, decode), *shape, *noise, LAYOUT=layout,
        **_format_constants(contract, x.dtype, split), scales_ptr=scales, rows_ptr=stats_out, STATS=stats,
        **constants.stats_bound(contract), ROW=stats_row(stats),
        LOG2=(layout.padded * layout.columns).bit_length() - 1, **_transform_args(contract, x, transform),
        AMAX_ONLY=False, **launch_options(layout.padded * layout.columns, stats))
    return (scales, stats_out) if stats else None


def transformed_abs_max(x, contract: KernelContract, axis: int) -> Tensor:
    """``amax.abs_max`` (the same rows: ``stats.write_abs_max``) of the contract's Hadamard transform of
    contiguous x, in one read of x (the transform is applied in the kernel, never stored): the
    float32 0-d amax the format's ``amax_of`` gives."""
    shape, layout = block_walk(x, contract, axis)
    programs = triton.cdiv(shape[0], layout.columns)
    rows = abs_max_rows(programs, x.device)
    _block_kernel[(programs,)](
        x, x, *tensor_scale_args(x, None, None), *shape, *noise_args(None, tuple(x.shape)), LAYOUT=layout,
        **_format_constants(contract, x.dtype, False), scales_ptr=x, rows_ptr=rows, STATS=NONE,
        **constants.stats_bound(contract), ROW=NO_ROW, LOG2=0, **_transform_args(contract, x, "forward"),
        AMAX_ONLY=True, **launch_options(layout.padded * layout.columns))
    return fold_abs_max(rows, contract.nonfinite_te).to(torch.float32)


def _transform_args(contract: KernelContract, x, transform: Optional[str]) -> dict:
    signs = x if transform is None else signs_on(contract.transform.signs, x.device)
    return dict(signs_ptr=signs, RHT=constants.rht(contract, transform))


def block_walk(x, contract: KernelContract, axis: int) -> tuple[tuple[int, ...], Layout]:
    """How ``_block_kernel`` walks x's blocks: its shape arguments (blocks in all, length, after,
    blocks along the axis, rows, cols) and its ``Layout``."""
    size = contract.block_size
    if contract.tiled:
        if x.dim() < 2:
            raise ValueError(f"{contract.name}: block_shape={contract.block_shape} needs a tensor with at least "
                             f"two dimensions")
        rows, cols = x.shape[-2], x.shape[-1]
        total = (x.numel() // (rows * cols)) * triton.cdiv(rows, size) * triton.cdiv(cols, size)
        length = after = n_blocks = 1
        block = size * size
    else:
        length, after = x.shape[axis], math.prod(x.shape[axis + 1:])
        n_blocks = triton.cdiv(length, size)
        total = math.prod(x.shape[:axis]) * n_blocks * after
        rows = cols = 1
        block = size
    padded = triton.next_power_of_2(block)
    columns = max(1, program_elements(ELEMENTS_PER_PROGRAM) // padded)
    flip = contract.tiled and contract.block_scale.four_over_six is not None and axis == x.dim() - 2  # W^T's tiles
    wide = total + columns > 2**31 - 1  # the last program's ids run past the blocks by up to columns - 1
    return (total, length, after, n_blocks, rows, cols), Layout(block, padded, size, contract.tiled, columns, flip,
                                                                wide)


def scale_layout(contract: KernelContract, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The shape of the per-block scales ``launch_blocks`` returns, in block order: the format's own
    layout (``formats.blocks``: the block dimension kept as 1 after the block index)."""
    size = contract.block_size
    if contract.tiled:
        return (*shape[:-2], triton.cdiv(shape[-2], size), triton.cdiv(shape[-1], size), 1)
    return (*shape[:axis], triton.cdiv(shape[axis], size), 1, *shape[axis + 1:])


def launch_dual(x, out0, out1, contract: KernelContract, noises: tuple[tuple, tuple], tensor: Optional[Tensor] = None,
                split: bool = False, decode: Optional[Tensor] = None) -> None:
    """Quantize a contiguous x (a matrix, or a batch of them in its last two dimensions) with a block
    format along axis -2 into out0 and along axis -1 into out1, reading x once (``noises``: the two
    quantizations' noise arguments; ``tensor``, ``decode``: as ``launch_blocks``' )."""
    rows, cols = x.shape[-2:]
    size = contract.block_size
    matrices = x.numel() // (rows * cols)
    _dual_kernel[(matrices * triton.cdiv(rows, size) * triton.cdiv(cols, size),)](
        x, out0, out1, *tensor_scale_args(x, tensor, decode), rows, cols, *noises[0], *noises[1], B=size,
        BP=triton.next_power_of_2(size), **_format_constants(contract, x.dtype, split),
        **launch_options(triton.next_power_of_2(size) ** 2))


def _format_constants(contract: KernelContract, dtype, split: bool) -> dict:
    """The format's constexpr arguments of ``block_values`` for inputs of ``dtype``."""
    return dict(ELEMENT=constants.element_grid(contract), SCALE=constants.block_scale(contract, dtype),
                SCALE_GRID=constants.scale_grid(contract), STOCHASTIC=DRAW_BITS[contract.rounding], SPLIT=split)
