"""The backward of the quantized flash attention (``flash_attention``): dQ, dK, dV as the unfused
quantized path computes them, P recomputed per tile from the forward's row max and sum.

Its operands come quantized as the unfused path's backward GEMMs quantize them (``OperandSpec`` axes of
``recipes.operands``): dP = dO V^T (dO and V along the head dimension), dV = P^T dO (P and dO along the
queries), dQ = dS K (dS and K along the keys), dK = dS^T Q (dS and Q along the queries); the kernel
quantizes P and dS itself, by the recipe's ``TileFormat`` of each. The softmax's backward is
``flash_attention_softmax``'s: dS = P * (dP - D), D = the row sum of dP * P (the unquantized P, as
megatron-core's softmax backward; not rowsum(dO * O), which differs once P is quantized) in the shared
order, so a first pass over the key blocks computes D before dS.

Two kernels: per query block, D then dQ (``_flash_dq_kernel``); per key block, dK and dV of one query head
(``_flash_dkdv_kernel``; GQA's key heads sum their query heads' afterwards, as ``repeat_interleave``'s
backward does). The score scale multiplies dQ and dK after their sums, each result in the inputs' dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .elementwise import load, store
from .flash_attention import (
    BLOCK_M,
    BLOCK_N,
    as_dtype,
    dot,
    fold_keys,
    head_bases,
    launch_args,
    load_rows,
    probs,
    quantize_tile,
    scores,
)
from .flash_attention_formats import TileFormats

# dK/dV's tiles for float32 inputs (its float32 dots hold more tiles than registers: 7 KB a thread spilled
# with 64 x 64 on sm_90); its tiles hold no row sum, and MX blocks of 32 along the queries still fit.
DKDV_BLOCK = 32


@triton.jit
def grad_probs(do, v, BF16: tl.constexpr, BF16_DOT: tl.constexpr):
    """dP = dO V^T of a tile, in the scores' dtype."""
    return as_dtype(dot(do, tl.trans(v), tl.zeros((do.shape[0], v.shape[0]), tl.float32), BF16_DOT), BF16)


@triton.jit
def grad_scores(p, hidden, dp, delta, BF16: tl.constexpr):
    """dS = P * (dP - D) of a tile in the scores' dtype, 0 where hidden."""
    return as_dtype(tl.where(hidden, 0.0, p * (dp - delta[:, None])), BF16)


@triton.jit
def load_columns(base, rows, cols, row_stride, n_rows, D: tl.constexpr):
    """float32 [cols, rows]: ``load_rows``' tile transposed, read so."""
    mask = (cols[:, None] < D) & (rows[None, :] < n_rows)
    return load(base + rows[None, :].to(tl.int64) * row_stride + cols[:, None], mask)


@triton.jit
def _flash_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, kk_ptr, dq_ptr, m_ptr, l_ptr, delta_ptr, s, heads, q_row, q_batch,
                     k_row, k_batch, scale, REP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                     CAUSAL: tl.constexpr, BF16: tl.constexpr, BF16_DOT: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, DS_KIND: tl.constexpr, DS_GRID: tl.constexpr, DS_SCALE: tl.constexpr,
                     DS_SGRID: tl.constexpr):
    """D (float32, [batch * heads, s]) and dQ of one query block: q, k the forward's Q and K; v, do V
    and dO along the head dimension; kk K along the keys."""
    bh = tl.program_id(1)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.arange(0, DP)
    q_base, k_base = head_bases(bh, heads, q_batch, k_batch, REP, D)
    q = load_rows(q_ptr + q_base, rows, cols, q_row, s, D)
    do = load_rows(do_ptr + q_base, rows, cols, q_row, s, D)
    stats = bh.to(tl.int64) * s + rows
    m = tl.load(m_ptr + stats, mask=rows < s, other=0.0)
    total = tl.load(l_ptr + stats, mask=rows < s, other=0.0)
    end = tl.minimum(s, (tl.program_id(0) + 1) * BM) if CAUSAL else s
    delta = tl.zeros((BM,), tl.float32)
    for start in range(0, end, BN):
        keys = start + tl.arange(0, BN)
        t, hidden = scores(q, load_rows(k_ptr + k_base, keys, cols, k_row, s, D), keys, rows, s, scale, CAUSAL,
                           BF16, BF16_DOT)
        dp = grad_probs(do, load_rows(v_ptr + k_base, keys, cols, k_row, s, D), BF16, BF16_DOT)
        delta = delta + fold_keys(tl.where(hidden, 0.0, dp * probs(t, hidden, m, total)))
    tl.store(delta_ptr + stats, delta, mask=rows < s)
    dq = tl.zeros((BM, DP), tl.float32)
    for start in range(0, end, BN):
        keys = start + tl.arange(0, BN)
        t, hidden = scores(q, load_rows(k_ptr + k_base, keys, cols, k_row, s, D), keys, rows, s, scale, CAUSAL,
                           BF16, BF16_DOT)
        dp = grad_probs(do, load_rows(v_ptr + k_base, keys, cols, k_row, s, D), BF16, BF16_DOT)
        ds = quantize_tile(grad_scores(probs(t, hidden, m, total), hidden, dp, delta, BF16), 1, DS_KIND, DS_GRID,
                           DS_SCALE, DS_SGRID)
        dq = dot(ds, load_rows(kk_ptr + k_base, keys, cols, k_row, s, D), dq, BF16_DOT)
    mask = (rows[:, None] < s) & (cols[None, :] < D)
    store(dq_ptr + q_base + rows[:, None].to(tl.int64) * q_row + cols[None, :], as_dtype(dq, BF16) * scale, mask)


@triton.jit
def _flash_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, qq_ptr, dos_ptr, dk_ptr, dv_ptr, m_ptr, l_ptr, delta_ptr, s,
                       heads, q_row, q_batch, k_row, k_batch, scale, REP: tl.constexpr, D: tl.constexpr,
                       DP: tl.constexpr, CAUSAL: tl.constexpr, BF16: tl.constexpr, BF16_DOT: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, P_KIND: tl.constexpr, P_GRID: tl.constexpr,
                       P_SCALE: tl.constexpr, P_SGRID: tl.constexpr, DS_KIND: tl.constexpr, DS_GRID: tl.constexpr,
                       DS_SCALE: tl.constexpr, DS_SGRID: tl.constexpr):
    """dK and dV of one key block for one query head ([s, b, heads, d]): q, k the forward's Q and K; v,
    do V and dO along the head dimension; qq Q and dos dO along the queries."""
    bh = tl.program_id(1)
    keys = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, DP)
    q_base, k_base = head_bases(bh, heads, q_batch, k_batch, REP, D)
    k = load_rows(k_ptr + k_base, keys, cols, k_row, s, D)
    v = load_rows(v_ptr + k_base, keys, cols, k_row, s, D)
    dk = tl.zeros((DP, BN), tl.float32)  # transposed: the dots take P and dS as computed, Q and dO as loaded
    dv = tl.zeros((DP, BN), tl.float32)
    first = (tl.program_id(0) * BN // BM) * BM if CAUSAL else 0
    for start in range(first, s, BM):
        rows = start + tl.arange(0, BM)
        q = load_rows(q_ptr + q_base, rows, cols, q_row, s, D)
        t, hidden = scores(q, k, keys, rows, s, scale, CAUSAL, BF16, BF16_DOT)
        stats = bh.to(tl.int64) * s + rows
        p = probs(t, hidden, tl.load(m_ptr + stats, mask=rows < s, other=0.0),
                  tl.load(l_ptr + stats, mask=rows < s, other=0.0))
        pq = quantize_tile(as_dtype(p, BF16), 0, P_KIND, P_GRID, P_SCALE, P_SGRID)
        dv = dot(load_columns(dos_ptr + q_base, rows, cols, q_row, s, D), pq, dv, BF16_DOT)
        dp = grad_probs(load_rows(do_ptr + q_base, rows, cols, q_row, s, D), v, BF16, BF16_DOT)
        ds = grad_scores(p, hidden, dp, tl.load(delta_ptr + stats, mask=rows < s, other=0.0), BF16)
        ds = quantize_tile(ds, 0, DS_KIND, DS_GRID, DS_SCALE, DS_SGRID)
        dk = dot(load_columns(qq_ptr + q_base, rows, cols, q_row, s, D), ds, dk, BF16_DOT)
    mask = (keys[None, :] < s) & (cols[:, None] < D)
    offsets = q_base + keys[None, :].to(tl.int64) * q_row + cols[:, None]
    store(dk_ptr + offsets, as_dtype(dk, BF16) * scale, mask)
    store(dv_ptr + offsets, dv, mask)


def flash_backward(operands: dict[str, Tensor], m: Tensor, total: Tensor, scale: float, causal: bool,
                   formats: TileFormats) -> tuple[Tensor, Tensor, Tensor]:
    """(dQ [s, b, heads, d], dK and dV [s, b, key heads, d]) in the inputs' dtype. ``operands``
    (contiguous, [s, b, heads or key heads, d], quantized as the module docstring says): ``query``,
    ``key`` (the forward's), ``value`` and ``grad_output`` along the head dimension, ``key_by_keys``,
    ``query_by_queries``, ``grad_output_by_queries``; ``m``, ``total``: the forward's row max and sum."""
    q, k = operands["query"], operands["key"]
    s, b, heads, d = q.shape
    args = launch_args(q, k, causal)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), scale)
    delta = torch.empty_like(m)
    dq = torch.empty_like(q)
    _flash_dq_kernel[(triton.cdiv(s, BLOCK_M), b * heads)](
        q, k, operands["value"], operands["grad_output"], operands["key_by_keys"], dq, m, total, delta, s, heads,
        *strides, **args, **formats.grads.args("DS"))
    dk, dv = torch.empty_like(q), torch.empty_like(q)  # per query head
    tiles = dict(BM=DKDV_BLOCK, BN=DKDV_BLOCK) if q.dtype == torch.float32 else {}
    _flash_dkdv_kernel[(triton.cdiv(s, tiles.get("BN", BLOCK_N)), b * heads)](
        q, k, operands["value"], operands["grad_output"], operands["query_by_queries"],
        operands["grad_output_by_queries"], dk, dv, m, total, delta, s, heads, *strides, **{**args, **tiles},
        **formats.probs_by_queries.args("P"), **formats.grads_by_queries.args("DS"))
    rep = args["REP"]
    if rep > 1:  # the key heads' gradients: their query heads' summed, as repeat_interleave's backward
        dk, dv = (x.unflatten(2, (heads // rep, rep)).sum(3) for x in (dk, dv))
    return dq, dk, dv
