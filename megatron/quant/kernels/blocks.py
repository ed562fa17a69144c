"""Triton kernel of the block-scaled formats: MX (``formats.mx``, every E8M0 scale mode), FP8
blockwise (``formats.fp8_blocks``, with or without power-of-two scales) and NVFP4
(``formats.nvfp``: E4M3 block scales under an FP32 tensor scale, TE's arithmetic);
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

from megatron.quant.formats import bits
from megatron.quant.formats.fp8_blocks import FP8BlockFormat
from megatron.quant.formats.grid import FP8_E4M3
from megatron.quant.formats.mx import SCALE_MODES, MXFormat
from megatron.quant.formats.nvfp import NVFPFormat

from .elementwise import load, round_grid, store, stored
from .launch import launch_options, program_elements
from .noise import global_index, noise_args, uniform
from .stats import NONE, abs_max_rows, bound_constants, fold_abs_max, stats_rows, write_abs_max, write_stats

ELEMENTS_PER_PROGRAM = 1024


@triton.jit
def exp2_int(k):
    """Exact 2**k as float32 for int32 k in [-149, 127] (``formats.bits.exp2_int``)."""
    normal = tl.minimum(tl.maximum(k, -126), 127)
    return ((normal + 127) << 23).to(tl.float32, bitcast=True) * ((k - normal + 127) << 23).to(tl.float32,
                                                                                                bitcast=True)


@triton.jit
def block_offsets(c, k, n_blocks_total, length, after, n_blocks, rows, cols, B: tl.constexpr,
                  SIDE: tl.constexpr, TILED: tl.constexpr):
    """(offsets, valid) of a [block position, block] tile: block ids ``c``, positions ``k``."""
    if TILED:  # c enumerates (matrix, tile row, tile column); k runs row by row through a SIDE x SIDE tile
        per_row = (cols + SIDE - 1) // SIDE
        per_matrix = ((rows + SIDE - 1) // SIDE) * per_row
        t = c % per_matrix
        row = (t // per_row) * SIDE + k[:, None] // SIDE
        col = (t % per_row) * SIDE + k[:, None] % SIDE
        valid = (k[:, None] < B) & (row < rows) & (col < cols) & (c < n_blocks_total)
        offsets = (c // per_matrix).to(tl.int64) * rows * cols + row * cols + col
    else:  # c enumerates (before, block, after) with after fastest
        a = c % after
        r = c // after
        position = (r % n_blocks) * B + k[:, None]
        valid = (k[:, None] < B) & (position < length) & (c < n_blocks_total)
        offsets = (r // n_blocks).to(tl.int64) * length * after + position.to(tl.int64) * after + a
    return offsets, valid


@triton.jit
def mx_scales(amax, EMAX: tl.constexpr, SCALE_MODE: tl.constexpr, HALF_ULP: tl.constexpr,
              MAX_MANTISSA: tl.constexpr):
    """(encode, decode) powers of two from finite block amaxes (``mx.mx_scale_exponent``)."""
    amax_bits = amax.to(tl.int32, bitcast=True)
    if SCALE_MODE == 2:  # even: the mantissa rounded to the element's width first (a carry bumps the exponent)
        amax_bits = amax_bits + HALF_ULP
    exponent = ((amax_bits >> 23) & 0xFF) - 127 - EMAX
    if SCALE_MODE == 1:  # ceil
        exponent = exponent + ((amax_bits & 0x7FFFFF) != 0).to(tl.int32)
    elif SCALE_MODE == 3:  # rceil
        exponent = exponent + ((amax_bits & 0x7FFFFF) > MAX_MANTISSA).to(tl.int32)
    exponent = tl.minimum(tl.maximum(exponent, -127), 127)
    exponent = tl.where(amax == float("inf"), 127, exponent)  # nonfinite="te": E8M0 0xFE
    return exp2_int(-exponent), exp2_int(exponent)


@triton.jit
def fp8_block_scales(amax, MAX_VALUE: tl.constexpr, POWER_OF_TWO: tl.constexpr, VALUE_FOR_INF: tl.constexpr):
    """(encode, decode) from block amaxes: ``base.encode_scale`` (TE's rule, an overflow gives
    ``VALUE_FOR_INF``, an Inf amax 1), IEEE division."""
    encode = tl.math.div_rn(tl.full(amax.shape, MAX_VALUE, tl.float32), amax)
    encode = tl.where(encode == float("inf"), VALUE_FOR_INF, encode)
    encode = tl.where((amax > 0) & (encode > 0), encode, 1.0)
    if POWER_OF_TWO:
        encode = (encode.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return encode, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), encode)


@triton.jit
def block_amax(x, AXIS: tl.constexpr, NONFINITE_TE: tl.constexpr):
    """(amax, nonfinite) of the blocks along ``AXIS`` of a 2-D tile, kept 2-D for broadcasting.
    te: the amax skips NaN (fmaxf) and may be Inf; propagate: a block holding Inf or NaN turns
    NaN (``nonfinite``), so only finite blocks' amaxes matter."""
    special = (x.to(tl.int32, bitcast=True) & 0x7F800000) == 0x7F800000
    nonfinite = tl.max(special.to(tl.int32), axis=AXIS, keep_dims=True) > 0
    amax = tl.max(tl.where((x != x) if NONFINITE_TE else special, 0.0, tl.abs(x)), axis=AXIS, keep_dims=True)
    return amax, nonfinite


@triton.jit
def block_values(x, amax, nonfinite, u, tensor_ptr, KIND: tl.constexpr, POWER_OF_TWO: tl.constexpr, EMAX: tl.constexpr,
                 SCALE_MODE: tl.constexpr, HALF_ULP: tl.constexpr, MAX_MANTISSA: tl.constexpr, MBITS: tl.constexpr,
                 MIN_FIELD: tl.constexpr, MAX_FIELD: tl.constexpr, MAX_VALUE: tl.constexpr, STOCHASTIC: tl.constexpr,
                 SPLIT: tl.constexpr, E4M3_MIN_FIELD: tl.constexpr, E4M3_MAX_FIELD: tl.constexpr,
                 NONFINITE_TE: tl.constexpr, VALUE_FOR_INF: tl.constexpr):
    """(x quantized with its blocks' amaxes, the blocks' scales as the torch path returns them):
    the per-block scale of the format (``KIND`` 0 MX, 1 FP8 blockwise, 2 NVFP4 whose tensor_ptr
    holds (global encode / 6, global decode)), the elements rounded (``u``: noise), decoded. The
    scale is what x was divided by, NaN for a block the format turns NaN."""
    if KIND == 0:
        encode, decode = mx_scales(amax, EMAX, SCALE_MODE, HALF_ULP, MAX_MANTISSA)
        scale = decode
    elif KIND == 1:
        encode, decode = fp8_block_scales(amax, MAX_VALUE, POWER_OF_TWO, VALUE_FOR_INF)
        scale = decode
    else:
        decode = round_grid(amax * tl.load(tensor_ptr), amax, amax, 1, 3, E4M3_MIN_FIELD, E4M3_MAX_FIELD, 448.0,
                            False, False, True, False)  # the block's E4M3 scale, to nearest
        scale = decode * tl.load(tensor_ptr + 1)
        encode = tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    scaled = x * encode
    if KIND == 2:  # a block whose scale rounded to zero quantizes to zero
        scaled = tl.where(scale == 0.0, 0.0, scaled)
    y = round_grid(scaled, u, x, 1, MBITS, MIN_FIELD, MAX_FIELD, MAX_VALUE, False, False, True, STOCHASTIC) * decode
    if KIND == 2 and not SPLIT:
        y = y * tl.load(tensor_ptr + 1)
    if not NONFINITE_TE:
        y = tl.where(nonfinite, float("nan"), y)
        scale = tl.where(nonfinite, float("nan"), scale)
    return y, scale


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
def _block_kernel(x_ptr, out_ptr, tensor_ptr, n_blocks_total, length, after, n_blocks, rows, cols, key_low, key_high,
                  g_after, g_local, g_rank_offset, g_row_stride, B: tl.constexpr, BP: tl.constexpr, SIDE: tl.constexpr,
                  TILED: tl.constexpr, COLS: tl.constexpr, KIND: tl.constexpr, POWER_OF_TWO: tl.constexpr,
                  EMAX: tl.constexpr,
                  SCALE_MODE: tl.constexpr, HALF_ULP: tl.constexpr, MAX_MANTISSA: tl.constexpr, MBITS: tl.constexpr,
                  MIN_FIELD: tl.constexpr, MAX_FIELD: tl.constexpr, MAX_VALUE: tl.constexpr, STOCHASTIC: tl.constexpr,
                  SPLIT: tl.constexpr, E4M3_MIN_FIELD: tl.constexpr, E4M3_MAX_FIELD: tl.constexpr,
                  NONFINITE_TE: tl.constexpr, VALUE_FOR_INF: tl.constexpr, scales_ptr, rows_ptr,
                  STATS: tl.constexpr, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr, WIDTH: tl.constexpr,
                  LOG2: tl.constexpr, signs_ptr, HADAMARD: tl.constexpr, NORM: tl.constexpr, INVERSE: tl.constexpr,
                  AMAX_ONLY: tl.constexpr):
    """Blocks ``c`` of a program, quantized into out; with ``STATS`` also their scales (one per
    block, in block order) and the program's row of statistics (``stats.write_stats``).
    ``HADAMARD`` (log2 of the group size, which is the block size): each block is replaced by its
    random Hadamard transform (``formats.hadamard``: signs, butterfly, norm) before quantization,
    and with ``INVERSE`` the quantized block is transformed back before it is stored.
    ``AMAX_ONLY``: quantize nothing; write the program's (max |x| over non-NaN, NaN count) to rows_ptr
    (``stats.write_abs_max``: the per-tensor amax of the transformed tensor)."""
    c = tl.program_id(0).to(tl.int64) * COLS + tl.arange(0, COLS)[None, :]
    k = tl.arange(0, BP)
    offsets, valid = block_offsets(c, k, n_blocks_total, length, after, n_blocks, rows, cols, B, SIDE, TILED)
    x = load(x_ptr + offsets, valid)
    xt = x
    if HADAMARD:
        signs = tl.load(signs_ptr + k)[:, None]
        xt = walsh_hadamard(x * signs, HADAMARD) * NORM
    if AMAX_ONLY:
        write_abs_max(rows_ptr, xt, valid)
    else:
        amax, nonfinite = block_amax(xt, 0, NONFINITE_TE)
        u = xt
        if STOCHASTIC:
            u = uniform(global_index(offsets, g_after, g_local, g_rank_offset, g_row_stride), key_low, key_high)
        y, scale = block_values(xt, amax, nonfinite, u, tensor_ptr, KIND, POWER_OF_TWO, EMAX, SCALE_MODE, HALF_ULP,
                                MAX_MANTISSA, MBITS, MIN_FIELD, MAX_FIELD, MAX_VALUE,
                                STOCHASTIC, SPLIT, E4M3_MIN_FIELD, E4M3_MAX_FIELD, NONFINITE_TE, VALUE_FOR_INF)
        if INVERSE:
            y = walsh_hadamard(y, HADAMARD) * NORM * signs
        store(out_ptr + offsets, y, valid)
        if STATS:
            tl.store(scales_ptr + c, scale, mask=c < n_blocks_total)
            write_stats(rows_ptr + tl.program_id(0).to(tl.int64) * WIDTH, x, stored(y, out_ptr), xt, scale, valid,
                        BOUND, INCLUSIVE, STATS, True, LOG2)


@triton.jit(do_not_specialize=["key0_low", "key0_high", "key1_low", "key1_high"])
def _dual_kernel(x_ptr, out0_ptr, out1_ptr, tensor_ptr, rows, cols, key0_low, key0_high, after0, local0, offset0,
                 stride0, key1_low, key1_high, after1, local1, offset1, stride1, B: tl.constexpr, BP: tl.constexpr,
                 KIND: tl.constexpr, POWER_OF_TWO: tl.constexpr, EMAX: tl.constexpr,
                 SCALE_MODE: tl.constexpr, HALF_ULP: tl.constexpr, MAX_MANTISSA: tl.constexpr, MBITS: tl.constexpr,
                 MIN_FIELD: tl.constexpr, MAX_FIELD: tl.constexpr, MAX_VALUE: tl.constexpr, STOCHASTIC: tl.constexpr,
                 SPLIT: tl.constexpr, E4M3_MIN_FIELD: tl.constexpr, E4M3_MAX_FIELD: tl.constexpr,
                 NONFINITE_TE: tl.constexpr, VALUE_FOR_INF: tl.constexpr):
    """Matrices (rows, cols) quantized along their rows (into out0) and columns (out1) from one read
    of each B x B tile; programs run through the tiles of one matrix, then the next."""
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
    amax, nonfinite = block_amax(x, 0, NONFINITE_TE)
    y, _ = block_values(x, amax, nonfinite, u0, tensor_ptr, KIND, POWER_OF_TWO, EMAX, SCALE_MODE, HALF_ULP,
                     MAX_MANTISSA, MBITS, MIN_FIELD, MAX_FIELD, MAX_VALUE,
                     STOCHASTIC, SPLIT, E4M3_MIN_FIELD, E4M3_MAX_FIELD, NONFINITE_TE, VALUE_FOR_INF)
    store(out0_ptr + offsets, y, valid)
    amax, nonfinite = block_amax(x, 1, NONFINITE_TE)
    y, _ = block_values(x, amax, nonfinite, u1, tensor_ptr, KIND, POWER_OF_TWO, EMAX, SCALE_MODE, HALF_ULP,
                     MAX_MANTISSA, MBITS, MIN_FIELD, MAX_FIELD, MAX_VALUE,
                     STOCHASTIC, SPLIT, E4M3_MIN_FIELD, E4M3_MAX_FIELD, NONFINITE_TE, VALUE_FOR_INF)
    store(out1_ptr + offsets, y, valid)


def launch_blocks(x, out, fmt, axis: int, noise: tuple, tensor: Optional[Tensor] = None, split: bool = False,
                  stats: int = NONE, transform: Optional[str] = None) -> Optional[tuple[Tensor, Tensor]]:
    """Quantize contiguous x with an MX, FP8 block or NVFP4 format (blocks along non-negative
    ``axis``, or ``fmt``'s tiles) into out. NVFP4: ``tensor`` holds (global encode / 6, global
    decode) and ``split`` leaves the global decode out of the values. ``stats`` (``stats.COUNTS`` or
    ``FULL``): also return (the blocks' scales in block order, the programs' rows of statistics).
    ``transform``: the format's Hadamard transform applied by the kernel (``fuses_transform``), out
    holding the quantized values in the transformed domain ("forward") or transformed back ("inverse");
    None: x is quantized as it is."""
    layout = _layout(x, fmt, axis)
    programs = triton.cdiv(layout["n_blocks_total"], layout["COLS"])
    scales, stats_out = ((torch.empty(layout["n_blocks_total"], dtype=torch.float32, device=x.device),
                          stats_rows(programs, stats, x.device)) if stats else (x, x))
    _block_kernel[(programs,)](
        x, out, x if tensor is None else tensor, *_layout_args(layout), *noise, **_layout_constants(layout),
        **_format_constants(fmt, x.dtype, split), scales_ptr=scales, rows_ptr=stats_out, STATS=stats,
        **bound_constants(fmt), WIDTH=stats_out.shape[-1] if stats else 0,
        LOG2=(layout["BP"] * layout["COLS"]).bit_length() - 1, **_transform_args(fmt, x, transform),
        AMAX_ONLY=False, **launch_options(layout["BP"] * layout["COLS"]))
    return (scales, stats_out) if stats else None


def transformed_abs_max(x, fmt, axis: int, skip_nan: bool) -> Tensor:
    """``amax.abs_max`` (the same rows: ``stats.write_abs_max``) of the format's Hadamard transform of
    contiguous x, in one read of x (the transform is applied in the kernel, never stored): the
    float32 0-d amax ``fmt.amax_of`` gives."""
    layout = _layout(x, fmt, axis)
    programs = triton.cdiv(layout["n_blocks_total"], layout["COLS"])
    rows = abs_max_rows(programs, x.device)
    _block_kernel[(programs,)](
        x, x, x, *_layout_args(layout), *noise_args(None, tuple(x.shape)), **_layout_constants(layout),
        **_format_constants(fmt, x.dtype, False), scales_ptr=x, rows_ptr=rows, STATS=NONE, **bound_constants(fmt),
        WIDTH=0, LOG2=0, **_transform_args(fmt, x, "forward"), AMAX_ONLY=True,
        **launch_options(layout["BP"] * layout["COLS"]))
    return fold_abs_max(rows, skip_nan).to(torch.float32)


def fuses_transform(fmt) -> bool:
    """True when the block kernel applies ``fmt``'s Hadamard transform itself: its groups are its
    blocks along an axis (te-nvfp4's 16, MX's 32)."""
    return (isinstance(fmt, (MXFormat, NVFPFormat, FP8BlockFormat)) and fmt.transforms_operand and not fmt.tiled
            and fmt.hadamard.size == fmt.block_size)


def _transform_args(fmt, x, transform: Optional[str]) -> dict:
    if transform is None:
        return dict(signs_ptr=x, HADAMARD=0, NORM=1.0, INVERSE=False)
    hadamard = fmt.hadamard
    return dict(signs_ptr=hadamard.signs.to(x.device), HADAMARD=hadamard.size.bit_length() - 1, NORM=hadamard.norm,
                INVERSE=transform == "inverse")


def _layout(x, fmt, axis: int) -> dict:
    """How ``_block_kernel`` walks x's blocks: its shape arguments and tile constants."""
    size = fmt.block_size
    if fmt.tiled:
        if x.dim() < 2:
            raise ValueError(f"{fmt.name}: block_shape={fmt.block_shape} needs a tensor with at least two dimensions")
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
    return dict(n_blocks_total=total, length=length, after=after, n_blocks=n_blocks, rows=rows, cols=cols, B=block,
                BP=padded, SIDE=size, TILED=fmt.tiled, COLS=max(1, program_elements(ELEMENTS_PER_PROGRAM) // padded))


def _layout_args(layout: dict) -> tuple:
    return tuple(layout[key] for key in ("n_blocks_total", "length", "after", "n_blocks", "rows", "cols"))


def _layout_constants(layout: dict) -> dict:
    return {key: layout[key] for key in ("B", "BP", "SIDE", "TILED", "COLS")}


def scale_layout(fmt, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The shape of the per-block scales ``launch_blocks`` returns, in block order: the format's own
    layout (``formats.blocks``: the block dimension kept as 1 after the block index)."""
    size = fmt.block_size
    if fmt.tiled:
        return (*shape[:-2], triton.cdiv(shape[-2], size), triton.cdiv(shape[-1], size), 1)
    return (*shape[:axis], triton.cdiv(shape[axis], size), 1, *shape[axis + 1:])


def launch_dual(x, out0, out1, fmt, noises: tuple[tuple, tuple], tensor: Optional[Tensor] = None,
                split: bool = False) -> None:
    """Quantize a contiguous x (a matrix, or a batch of them in its last two dimensions) with a block
    format along axis -2 into out0 and along axis -1 into out1, reading x once (``noises``: the two
    quantizations' noise arguments)."""
    rows, cols = x.shape[-2:]
    size = fmt.block_size
    matrices = x.numel() // (rows * cols)
    _dual_kernel[(matrices * triton.cdiv(rows, size) * triton.cdiv(cols, size),)](
        x, out0, out1, x if tensor is None else tensor, rows, cols, *noises[0], *noises[1], B=size,
        BP=triton.next_power_of_2(size), **_format_constants(fmt, x.dtype, split),
        **launch_options(triton.next_power_of_2(size) ** 2))


def _format_constants(fmt, dtype, split: bool) -> dict:
    """The constexpr arguments of ``block_values`` for ``fmt`` and inputs of ``dtype``."""
    element = fmt.element
    mx = isinstance(fmt, MXFormat)
    return dict(
        KIND=0 if mx else 2 if isinstance(fmt, NVFPFormat) else 1,
        POWER_OF_TWO=bool(fmt.options.get("power_of_two_scales")),
        EMAX=element.max_exponent, SCALE_MODE=SCALE_MODES.index(fmt.options["scale_mode"]) if mx else 0,
        HALF_ULP=1 << (bits.MANTISSA_BITS - element.mbits - 1), MAX_MANTISSA=bits.mantissa_of(element.max_value),
        MBITS=element.mbits, MIN_FIELD=(element.min_exponent + 127) << 23,
        MAX_FIELD=(element.max_exponent + 127) << 23, MAX_VALUE=float(element.max_value),
        STOCHASTIC=fmt.rounding == "stochastic", SPLIT=split, E4M3_MIN_FIELD=(FP8_E4M3.min_exponent + 127) << 23,
        E4M3_MAX_FIELD=(FP8_E4M3.max_exponent + 127) << 23, NONFINITE_TE=fmt.options.get("nonfinite") == "te",
        VALUE_FOR_INF=float(torch.finfo(dtype).max))  # TE's block kernels: the input dtype's max
