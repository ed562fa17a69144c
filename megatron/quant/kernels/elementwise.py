"""Triton kernels of the elementwise formats (``formats.elementwise``, ``formats.hifloat8``):
bf16/fp16 casts and the FP8/HiF8 grids, unscaled or with a per-tensor scale, round to nearest
or stochastic. One pass: read x, write the quantized values in the output's dtype.

The rounding is ``formats.grid``'s, written for one element: scale by the grid spacing's
inverse (a power of two built from the exponent field), pick an integer (to nearest by float32
additions alone, stochastic with exact float32 compares), scale back, apply the overflow rule. A
per-tensor scale is computed in the kernel (``tensor_scale``, ``encode_scale``'s arithmetic, which the
tests hold bit for bit) from rows of magnitude bits: the amax kernel's over x (two launches and nothing
between them), or a given float32 amax (delayed scaling's, a reduced one) as one row; with statistics it
arrives as device pointers to the torch path's own encode/decode factors. No host sync either way.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl
from torch import Tensor

from megatron.quant.formats.contract import KernelContract
from megatron.quant.formats.rounding import CONTINUOUS_BITS, DRAW_BITS

from . import constants
from .launch import launch_options, program_elements
from .noise import global_index, uniform
from .stats import NONE, stats_row, stats_rows, write_abs_max, write_stats

BLOCK = 1024
MAX_ROWS = 256  # amax rows a program folds for its per-tensor scale (``amax.abs_max_rows_of``; 1 KB from L2)
FOLD_BLOCK = 8192  # elements of a program that folds them: the fold's ~165 instructions a thread over 32 elements
_CONTINUOUS = tl.constexpr(CONTINUOUS_BITS)  # the rounding's draw that compares U[0, 1) with the remainder


@triton.jit
def round_integer(a, u, signs, STOCHASTIC: tl.constexpr, AWAY: tl.constexpr):
    """``rounding.py``'s rules on float32 a: nearest-even (keeps a's sign), or on magnitudes with
    the sign of ``signs``: nearest with ties away, or stochastic (``u``: U[0, 1); ``STOCHASTIC``: the
    random bits drawn per element, ``rounding.DRAW_BITS``: all 24 the continuous draw, fewer the
    hardware's carry rule), as ``ElementGrid.round_`` does. To nearest, exact for |a| < 2**22 (every
    value a grid rounds without overflowing); beyond, the result stays beyond 2**22 - 2, Inf and NaN
    are kept. Stochastic: magnitudes >= 2**23, Inf and NaN are kept."""
    if STOCHASTIC:
        m = tl.abs(a)
        small = m < 8388608.0
        t = tl.where(small, m, 0.0).to(tl.int32)
        whole = t.to(tl.float32)
        f = m - whole  # exact
        if STOCHASTIC >= _CONTINUOUS:
            up = u < f
        else:
            steps: tl.constexpr = float(1 << STOCHASTIC)
            up = tl.floor(u * steps) + tl.floor(f * steps) >= steps  # exact integers in float32
        r = tl.where(small, whole + up.to(tl.float32), m)
    elif AWAY:
        m = tl.abs(a)
        r = nearest_even(m)
        r = tl.where(m - r == 0.5, r + 1.0, r)  # m - r is exact: a tie rounded down to even goes up
    else:
        r = nearest_even(a)  # a's sign but where it rounds to zero: +0, given a's sign below
    sign = (signs if STOCHASTIC or AWAY else a).to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def nearest_even(a):
    """a rounded to an integer, ties to even, by float32 additions alone (no conversion to an integer,
    which runs at an eighth of the adds' rate): a + 1.5 * 2**23 lies in [2**23, 2**24), where the
    float32 spacing is 1, so the sum is rounded to an integer as IEEE rounds, and subtracting
    1.5 * 2**23 again is exact. Exact for |a| < 2**22; beyond, |result| >= 2**22 - 2."""
    return (a + 12582912.0) - 12582912.0


@triton.jit
def round_grid(x, u, signs, GRID: tl.constexpr, STOCHASTIC: tl.constexpr):
    """float32 x rounded onto a grid (``ElementGrid.round_``, ``signs`` as there), or to bfloat16
    (``_round_bf16``); ``GRID``: ``constants.Grid``; ``STOCHASTIC`` as in ``round_integer``. Every
    value the grid holds is below 2**22 of its binade's spacing, so ``round_integer`` is exact
    wherever the result is not an overflow."""
    xbits = x.to(tl.int32, bitcast=True)
    if GRID.kind == 0:  # bf16: round the float32 bit pattern at bit 16
        if STOCHASTIC >= 16:
            added = (u * 65536.0).to(tl.int32)
        elif STOCHASTIC:  # the random bits at the top of the 16 dropped ones
            added = (u * float(1 << STOCHASTIC)).to(tl.int32) << (16 - STOCHASTIC)
        else:
            added = ((xbits >> 16) & 1) + 0x7FFF
        y = ((xbits + added) & -65536).to(tl.float32, bitcast=True)
        return tl.where(x != x, x, y)
    field = xbits & 0x7F800000
    if GRID.kind == 2:  # HiF8: q = e - 3 + [|e| >= 4] + [|e| >= 8] + [|e| >= 16], e clamped to [-22, 15]
        e = tl.minimum(tl.maximum((field >> 23) - 127, -22), 15)
        t = tl.abs(e)
        c = (t >= 4).to(tl.int32) + (t >= 8).to(tl.int32) + (t >= 16).to(tl.int32)
        field = (e + c + 124) << 23
    else:
        field = tl.minimum(tl.maximum(field, GRID.min_field), GRID.max_field) - (GRID.mbits << 23)
    inverse = ((254 << 23) - field).to(tl.float32, bitcast=True)
    r = round_integer(x * inverse, u, signs, STOCHASTIC, GRID.kind == 2)
    y = r * field.to(tl.float32, bitcast=True)
    top: tl.constexpr = GRID.max_value
    if GRID.overflow_inf and GRID.has_inf:  # +-Inf: y's sign on Inf's bits
        beyond = ((y.to(tl.int32, bitcast=True) & -2147483648) | 0x7F800000).to(tl.float32, bitcast=True)
        y = tl.where(tl.abs(y) > top, beyond, y)
    elif GRID.overflow_inf:  # no Inf in the format: beyond max is NaN
        y = tl.where(tl.abs(y) > top, float("nan"), y)
    else:  # saturate, NaN kept
        y = tl.minimum(tl.maximum(y, -top, propagate_nan=tl.PropagateNan.ALL), top,
                       propagate_nan=tl.PropagateNan.ALL)
    if not GRID.signed_zero:
        y = tl.where(y == 0.0, 0.0, y)
    return y


@triton.jit
def tensor_scale(rows_ptr, n_rows, FOLD: tl.constexpr, TARGET: tl.constexpr, POW2: tl.constexpr):
    """(encode, decode) of a per-tensor scale from the amax kernel's rows of magnitude bits
    (``amax.abs_max_rows_of``: at most ``FOLD``, NaN already propagated or skipped): ``scale_of`` their max."""
    return scale_of(fold_magnitudes(rows_ptr, n_rows, FOLD), TARGET, POW2)


@triton.jit
def fold_magnitudes(rows_ptr, n_rows, FOLD: tl.constexpr):
    """The float32 max of at most ``FOLD`` int32 rows of magnitude bits (``amax.abs_max_rows_of``)."""
    r = tl.arange(0, FOLD)
    return tl.max(tl.load(rows_ptr + r, mask=r < n_rows, other=0), axis=0).to(tl.float32, bitcast=True)


@triton.jit
def scale_of(amax, TARGET: tl.constexpr, POW2: tl.constexpr):
    """(encode, decode) of a per-tensor scale from a float32 amax: ``formats.base.encode_scale`` with its
    float32 max for an infinite quotient, and ``1 / encode``; each division rounded to nearest, as torch's."""
    encode = tl.math.div_rn(tl.full((), TARGET, tl.float32), amax)
    encode = tl.where(tl.abs(encode) == float("inf"), 3.4028234663852886e38, encode)
    encode = tl.where((amax > 0) & (encode > 0), encode, 1.0)
    if POW2:
        encode = (encode.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    return encode, tl.math.div_rn(tl.full((), 1.0, tl.float32), encode)


@triton.jit(do_not_specialize=["key_low", "key_high"])
def _elementwise_kernel(x_ptr, out_ptr, encode_ptr, decode_ptr, n, key_low, key_high, after, local, rank_offset,
                        row_stride, GRID: tl.constexpr, STOCHASTIC: tl.constexpr,
                        SCALED: tl.constexpr, DECODE: tl.constexpr, BLOCK_SIZE: tl.constexpr, rows_ptr,
                        STATS: tl.constexpr, BOUND: tl.constexpr, INCLUSIVE: tl.constexpr, ROW: tl.constexpr,
                        LOG2: tl.constexpr, amax_ptr, AMAX_OUT: tl.constexpr, fold_ptr, n_rows, FOLD: tl.constexpr,
                        TARGET: tl.constexpr, POW2: tl.constexpr):
    """x quantized into out; with ``STATS`` also the program's row of statistics (``stats.write_stats``),
    with ``AMAX_OUT`` its row of x's amax (``stats.write_abs_max``: delayed scaling's history records
    the tensor it quantizes without reading it again). With ``FOLD`` (and ``SCALED``) the per-tensor
    scale comes from the ``n_rows`` rows of magnitude bits at fold_ptr (``tensor_scale``: x's amax rows,
    or a given float32 amax as one row), and the first program writes its decode factor to decode_ptr."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = load(x_ptr + offsets, mask)
    u = x  # unused unless stochastic
    if STOCHASTIC:
        u = uniform(global_index(offsets, after, local, rank_offset, row_stride), key_low, key_high)
    scaled = x
    if FOLD:
        encode, decode = tensor_scale(fold_ptr, n_rows, FOLD, TARGET, POW2)
        if tl.program_id(0) == 0:
            tl.store(decode_ptr, decode)
        scaled = x * encode
    elif SCALED:
        scaled = x * tl.load(encode_ptr)
    y = round_grid(scaled, u, scaled, GRID, STOCHASTIC)
    if FOLD:
        if DECODE:
            y = y * decode
    elif DECODE:
        y = y * tl.load(decode_ptr)
    store(out_ptr + offsets, y, mask)
    if AMAX_OUT:
        write_abs_max(amax_ptr, x, mask)
    if STATS:
        scale = tl.load(decode_ptr) if SCALED else 1.0
        write_stats(rows_ptr + tl.program_id(0).to(tl.int64) * ROW.width, x, stored(y, out_ptr), x, scale, mask, BOUND,
                    INCLUSIVE, STATS, False, LOG2, ROW)


@triton.jit
def load(pointers, mask):
    """float32 values of float32/bf16/fp16 pointers. bf16 in Triton's interpreter through its bits
    (exact; the interpreter converts bf16 subnormals wrongly); compiled, the hardware's exact widening."""
    if pointers.dtype.element_ty == tl.bfloat16 and not COMPILED:
        raw = tl.load(pointers.to(tl.pointer_type(tl.int16)), mask=mask, other=0)
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.load(pointers, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store(pointers, y, mask):
    """Store float32 y in the pointers' dtype rounded to nearest even, as torch's ``.to`` does. bf16
    in Triton's interpreter as its bits (ties to even at bit 16, NaN kept NaN; the interpreter's own
    conversion truncates); compiled, the hardware's conversion (``cvt.rn.bf16x2.f32``: two values an
    instruction, IEEE's rounding, subnormals kept; any NaN a NaN, as the tests compare them)."""
    if pointers.dtype.element_ty == tl.bfloat16 and not COMPILED:
        rounded = tl.where(y != y, 0x7FC0, bf16_bits(y))
        tl.store(pointers.to(tl.pointer_type(tl.int16)), rounded.to(tl.int16), mask=mask)
    else:
        tl.store(pointers, y.to(pointers.dtype.element_ty), mask=mask)


@triton.jit
def bf16_bits(y):
    """The bfloat16 bits of float32 y rounded to nearest even (in the low 16 bits of an int32)."""
    bits = y.to(tl.int32, bitcast=True)
    return (bits + ((bits >> 16) & 1) + 0x7FFF) >> 16


@triton.jit
def stored(y, pointers):
    """float32 y as ``store`` stores it through ``pointers``, read back as float32."""
    if pointers.dtype.element_ty == tl.bfloat16 and not COMPILED:
        return tl.where(y != y, y, (bf16_bits(y) << 16).to(tl.float32, bitcast=True))
    return y.to(pointers.dtype.element_ty).to(tl.float32)


# Whether the kernels run compiled (True) or in Triton's interpreter, as Triton decided when it
# decorated them (``TRITON_INTERPRET`` at import): the bf16 conversions above differ between the two.
COMPILED = tl.constexpr(isinstance(bf16_bits, triton.runtime.JITFunction))


def launch(x, out, contract: KernelContract, encode, decode, noise: tuple, stats: int = NONE,
           amax_rows: Optional[Tensor] = None, fold_rows: Optional[Tensor] = None, split: bool = False
           ) -> Optional[Tensor]:
    """Run the elementwise kernel over contiguous x into out, rounding by an elementwise format's
    ``contract``; ``encode``/``decode``: 0-d float32 device tensors or None (unscaled; decode None
    also for the split GEMM operand). ``stats`` (``stats.COUNTS`` or ``FULL``): also return the
    programs' rows of statistics. ``amax_rows`` (``stats.abs_max_rows`` of ``programs(x, fold_rows)``):
    filled with x's amax rows too. ``fold_rows`` (int32 magnitude bits: ``amax.abs_max_rows_of``, or a
    float32 amax viewed as one row): the per-tensor scale is taken from them in the kernel and its decode
    factor written into ``decode`` (a float32 output); ``split``: the values leave it out (the GEMM operand)."""
    n = x.numel()
    folding = fold_rows is not None
    scaled, dec = encode is not None or folding, decode is not None and not (folding and split)
    block = program_elements(FOLD_BLOCK if folding else BLOCK)
    grid = programs(x, folding)
    rows = stats_rows(grid, stats, x.device) if stats else x
    fold = dict(n_rows=0, FOLD=0, TARGET=0.0, POW2=False)
    if folding:
        fold = dict(n_rows=fold_rows.shape[0], FOLD=MAX_ROWS, TARGET=float(contract.tensor_scale.target),
                    POW2=bool(contract.tensor_scale.power_of_two))
    _elementwise_kernel[(grid,)](
        x, out, x if encode is None else encode, x if decode is None else decode, n, *noise,
        GRID=constants.element_grid(contract), STOCHASTIC=DRAW_BITS[contract.rounding], SCALED=scaled, DECODE=dec,
        BLOCK_SIZE=block, rows_ptr=rows, STATS=stats, **constants.stats_bound(contract), ROW=stats_row(stats),
        LOG2=block.bit_length() - 1, amax_ptr=x if amax_rows is None else amax_rows, AMAX_OUT=amax_rows is not None,
        fold_ptr=fold_rows if folding else x, **fold, **launch_options(block, stats))
    return rows if stats else None


def programs(x: Tensor, folding: bool = False) -> int:
    """The elementwise kernel's programs over x (``folding``: with a per-tensor scale taken in the kernel)."""
    return triton.cdiv(x.numel(), program_elements(FOLD_BLOCK if folding else BLOCK))
