"""A Triton flash attention whose probabilities P and score gradients dS are quantized inside the
kernel, bit-equal to the unfused quantized path (``layers/attention.py``) where the GEMMs' float32
sums are exact; no [s, s] tensor is kept. The backward is ``flash_attention_backward``.

It takes Q, K, V already quantized (as the layer quantizes them: Q and K along the head dimension, V
along the keys), in megatron's [s, b, heads, d] layout, GQA unexpanded. P must be normalised before it
is quantized, so the online (rescaling) softmax only gives the row statistics: the forward makes two
passes over the key blocks of a query block, each recomputing S = Q K^T * scale: the row max and the
row sum of exp(S - max), rescaled block by block (``flash_attention_softmax``: the exp, the sum order and
the rescaling the unfused path shares), then P = exp(S - max) / sum, rounded to the scores' dtype,
quantized along the keys, and O += P V.

What the kernel quantizes: ``flash_attention_formats``. Causal or no mask; no dropout.

Bit equality: the softmax, its backward and the quantizations are the unfused path's operation for
operation, so the two differ only where a GEMM's float32 sum does. Products of operands on <= 8-bit
grids are exact in float32, but a sum of many is exact only while its terms span fewer than 24 bits;
then every summation order gives the same float32 and O, dQ, dK, dV equal the unfused path's bit for
bit (``tests/kernels/test_flash_attention.py``: mxfp4 at 48 and 80 tokens, head size 32, float32 and
bf16, under Triton's interpreter). HiF8's tapered grid (and MXFP8's three mantissa bits) keep dS values
far apart, so dQ and dK may differ in an element or a few by an ulp, as two GEMM libraries do.
On a GPU the products run on bf16 tensor cores for bf16 inputs (quantized values are exact in bf16)
and as IEEE float32 dots for float32 inputs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .block_scales import exp2_int
from .blocks import block_amax, block_values, fold_half
from .elementwise import bf16_bits, load, round_grid, store
from .flash_attention_formats import TileFormat
from .flash_attention_softmax import EXP_FLOOR, KEY_BLOCK, LN2_HI, LN2_LO, LOG2E, TAYLOR
from .launch import EXACT_ARITHMETIC, interpreting

BLOCK_M = 64  # queries a program holds
BLOCK_N = KEY_BLOCK  # keys a step holds: the softmax sum's block
# Warps a program: with 4, the float32 kernels spilled 0.4-13 KB a thread for head size 64 on sm_90 (Triton 3.9,
# ptxas); with 8 the bf16 ones spill nothing, the float32 ones 0.1-0.6 KB (HiF8 and MXFP4 measured).
NUM_WARPS = 8
_LOG2E, _LN2_HI, _LN2_LO, _EXP_FLOOR = (tl.constexpr(c) for c in (LOG2E, LN2_HI, LN2_LO, EXP_FLOOR))
_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = (tl.constexpr(c) for c in TAYLOR)


@triton.jit
def defined_exp(x):
    """``flash_attention_softmax.defined_exp``, operation for operation."""
    x = tl.maximum(x, _EXP_FLOOR)
    k = tl.floor(x * _LOG2E + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = ((((((_T0 * r + _T1) * r + _T2) * r + _T3) * r + _T4) * r + _T5) * r + _T6) * r + _T7
    return poly * exp2_int(k.to(tl.int32))


@triton.jit
def fold_keys(t):
    """Row sums of a [rows, 64] tile in ``flash_attention_softmax.row_sum``'s order within a block."""
    t = fold_half(fold_half(fold_half(fold_half(fold_half(fold_half(tl.trans(t)))))))
    return tl.reshape(t, (t.shape[1],))


@triton.jit
def as_dtype(x, BF16: tl.constexpr):
    """float32 x rounded to the scores' dtype (bf16: to nearest even; float32: unchanged)."""
    if BF16:
        x = (bf16_bits(x) << 16).to(tl.float32, bitcast=True)
    return x


@triton.jit
def quantize_tile(x, AXIS: tl.constexpr, KIND: tl.constexpr, GRID: tl.constexpr, SCALE: tl.constexpr,
                  SGRID: tl.constexpr):
    """A float32 [queries, keys] tile quantized by a ``TileFormat`` (blocks along ``AXIS``: 1 keys, 0 queries)."""
    y = x
    M: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    if KIND == 1:
        y = round_grid(x, x, x, GRID, 0)
    elif KIND > 1:
        if AXIS == 1:
            blocks = tl.reshape(x, (M, N // KIND, KIND))
            amax, nonfinite = block_amax(blocks, 2, SCALE.nonfinite_te)
        else:
            blocks = tl.reshape(x, (M // KIND, KIND, N))
            amax, nonfinite = block_amax(blocks, 1, SCALE.nonfinite_te)
        # MX blocks carry no tensor scale: block_values reads its multiplier and tensor terms only for NVFP's
        values, _ = block_values(blocks, amax, nonfinite, blocks, 1.0, 1.0, 1.0, 0.0, GRID, SCALE, SGRID, 0, False,
                                 False)
        y = tl.reshape(values, (M, N))
    return y


@triton.jit
def dot(a, b, acc, BF16_DOT: tl.constexpr):
    """acc + a @ b for float32 tiles of exactly representable values: bf16 tensor cores or IEEE float32."""
    if BF16_DOT:
        acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def load_rows(base, rows, cols, row_stride, n_rows, D: tl.constexpr):
    """float32 [rows, cols] of a [s, ...] tensor's rows at ``base`` (head dimension ``D``)."""
    mask = (rows[:, None] < n_rows) & (cols[None, :] < D)
    return load(base + rows[:, None].to(tl.int64) * row_stride + cols[None, :], mask)


@triton.jit
def scores(q, k, keys, rows, s, scale, CAUSAL: tl.constexpr, BF16: tl.constexpr, BF16_DOT: tl.constexpr):
    """(S = Q K^T * scale in the scores' dtype with hidden keys at -inf, hidden) of a query tile and a key
    tile (``rows``, ``keys``: their positions); rows and keys beyond ``s`` are hidden."""
    acc = tl.zeros((q.shape[0], k.shape[0]), tl.float32)
    t = as_dtype(dot(q, tl.trans(k), acc, BF16_DOT) * scale, BF16)
    hidden = (keys[None, :] >= s) | (rows[:, None] >= s)
    if CAUSAL:
        hidden = hidden | (keys[None, :] > rows[:, None])
    return tl.where(hidden, float("-inf"), t), hidden


@triton.jit
def row_stats(q, k_base, cols, k_row, s, rows, scale, end, CAUSAL: tl.constexpr, D: tl.constexpr,
              BF16: tl.constexpr, BF16_DOT: tl.constexpr, BN: tl.constexpr):
    """(row max, row sum of exp(S - max)) over the keys below ``end``, in one pass:
    ``flash_attention_softmax.row_stats``' operations."""
    m = tl.full((q.shape[0],), float("-inf"), tl.float32)
    total = tl.zeros((q.shape[0],), tl.float32)
    for start in range(0, end, BN):
        keys = start + tl.arange(0, BN)
        t, hidden = scores(q, load_rows(k_base, keys, cols, k_row, s, D), keys, rows, s, scale, CAUSAL, BF16,
                           BF16_DOT)
        new = tl.maximum(m, tl.max(t, axis=1))
        shift = tl.where(new == float("-inf"), 0.0, new)  # rows beyond s: every key hidden
        e = tl.where(hidden, 0.0, defined_exp(t - shift[:, None]))
        total = total * defined_exp(m - shift) + fold_keys(e)
        m = new
    return tl.where(m == float("-inf"), 0.0, m), total


@triton.jit
def probs(t, hidden, m, total):
    """float32 P = exp(S - max) / sum of a scores tile (0 where hidden)."""
    e = defined_exp(t - m[:, None])
    divisor = tl.where(total > 0.0, total, 1.0)  # rows beyond s: nothing to divide
    return tl.where(hidden, 0.0, tl.math.div_rn(e, tl.broadcast_to(divisor[:, None], e.shape)))


@triton.jit
def head_bases(bh, heads, q_batch, k_batch, REP: tl.constexpr, D: tl.constexpr):
    """(query head's, its key head's) first element for program axis 1's (batch, head) ``bh`` in the
    [s, b, heads, d] layout; GQA: ``REP`` query heads share a key head."""
    b, h = bh // heads, bh % heads
    return b.to(tl.int64) * q_batch + h * D, b.to(tl.int64) * k_batch + (h // REP) * D


@triton.jit
def _flash_forward_kernel(q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, l_ptr, s, heads, q_row, q_batch, k_row, k_batch,
                          scale, REP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, CAUSAL: tl.constexpr,
                          BF16: tl.constexpr, BF16_DOT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          P_KIND: tl.constexpr, P_GRID: tl.constexpr, P_SCALE: tl.constexpr, P_SGRID: tl.constexpr):
    """O of one query block of one (batch, head): the module docstring's two passes. Writes the
    rows' max and sum (float32, [batch * heads, s]) for the backward."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, DP)
    q_base, k_base = head_bases(bh, heads, q_batch, k_batch, REP, D)
    q = load_rows(q_ptr + q_base, rows, cols, q_row, s, D)
    end = tl.minimum(s, (tl.program_id(0) + 1) * BM) if CAUSAL else s
    m, total = row_stats(q, k_ptr + k_base, cols, k_row, s, rows, scale, end, CAUSAL, D, BF16, BF16_DOT, BN)
    acc = tl.zeros((BM, DP), tl.float32)
    for start in range(0, end, BN):
        keys = start + tl.arange(0, BN)
        k = load_rows(k_ptr + k_base, keys, cols, k_row, s, D)
        t, hidden = scores(q, k, keys, rows, s, scale, CAUSAL, BF16, BF16_DOT)
        p = quantize_tile(as_dtype(probs(t, hidden, m, total), BF16), 1, P_KIND, P_GRID, P_SCALE, P_SGRID)
        acc = dot(p, load_rows(v_ptr + k_base, keys, cols, k_row, s, D), acc, BF16_DOT)
    row_mask = (rows[:, None] < s) & (cols[None, :] < D)
    store(out_ptr + q_base + rows[:, None].to(tl.int64) * q_row + cols[None, :], acc, row_mask)
    stats = bh.to(tl.int64) * s + rows
    tl.store(m_ptr + stats, m, mask=rows < s)
    tl.store(l_ptr + stats, total, mask=rows < s)


def check_inputs(query: Tensor, key: Tensor) -> int:
    """GQA's repeat (query heads per key head); ValueError for what the kernel does not take."""
    if query.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"flash attention takes float32 or bfloat16 inputs, not {query.dtype}")
    if query.shape[0] != key.shape[0] or query.shape[2] % key.shape[2]:
        raise ValueError(f"flash attention needs as many keys as queries and query heads a multiple of key heads; "
                         f"got query {tuple(query.shape)}, key {tuple(key.shape)}")
    return query.shape[2] // key.shape[2]


def launch_args(query: Tensor, key: Tensor, causal: bool) -> dict:
    """The constexprs every flash attention kernel takes."""
    bf16 = query.dtype == torch.bfloat16
    return dict(REP=check_inputs(query, key), D=query.shape[3], DP=max(16, triton.next_power_of_2(query.shape[3])),
                CAUSAL=causal, BF16=bf16, BF16_DOT=bf16 and not interpreting(), BM=BLOCK_M, BN=BLOCK_N,
                **EXACT_ARITHMETIC, num_warps=NUM_WARPS)


def flash_forward(query: Tensor, key: Tensor, value: Tensor, scale: float, causal: bool, probs_format: TileFormat
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """(O [s, b, heads, d] in the inputs' dtype, the rows' max and sum [b * heads, s] float32) of quantized
    Q [s, b, heads, d], K and V [s, b, key heads, d] (contiguous), P quantized by ``probs_format``."""
    s, b, heads, _ = query.shape
    out = torch.empty_like(query)
    m = torch.empty((b * heads, s), dtype=torch.float32, device=query.device)
    total = torch.empty_like(m)
    _flash_forward_kernel[(triton.cdiv(s, BLOCK_M), b * heads)](
        query, key, value, out, m, total, s, heads, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        scale, **launch_args(query, key, causal), **probs_format.args("P"))
    return out, m, total
