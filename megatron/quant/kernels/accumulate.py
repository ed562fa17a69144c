"""The Hopper FP8 accumulation model (``formats.accumulation``) as a Triton kernel: each program
computes a BM x BN tile of C = a b^T, chaining 32-product steps along K exactly as the torch model
does (products aligned to the block's largest exponent, truncated to 13 fraction bits, summed as
integers, the sum truncated to 13 fraction bits), fast or promoted every 128 elements. Every step
is exact or a truncation, so the result is the torch model's bit for bit. No split-K."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from megatron.quant.formats.accumulation import (
    BLOCK,
    FLOOR,
    FRACTION_BITS,
    MIN_NORMAL_EXPONENT,
    PROMOTE_EVERY,
    FP8Kind,
)

from .launch import launch_options

TILE = 16  # outputs per program along M and along N


@triton.jit
def _exponents(x, EMIN: tl.constexpr):
    """floor(log2 |x|) of FP8 values in float32, clamped at the format's smallest normal exponent; -1000 for 0."""
    biased = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return tl.where(x == 0.0, -1000, tl.maximum(biased - 127, EMIN))


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _hopper_kernel(a_ptr, b_ptr, out_ptr, M, N, K, EMIN_A: tl.constexpr, EMIN_B: tl.constexpr, FAST: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STEPS_PER_PROMOTION: tl.constexpr,
                   FRACTION: tl.constexpr, EXPONENT_FLOOR: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    total = tl.zeros((BM, BN), dtype=tl.float32)
    mask = (1 << (23 - FRACTION)) - 1
    for step in range(0, tl.cdiv(K, BK)):
        k = step * BK + kk
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)
        b = tl.load(b_ptr + rn[:, None].to(tl.int64) * K + k[None, :], mask=(rn[:, None] < N) & (k[None, :] < K),
                    other=0.0)
        products = a[:, None, :] * b[None, :, :]  # exact in float32
        exponent = tl.max(_exponents(a, EMIN_A)[:, None, :] + _exponents(b, EMIN_B)[None, :, :], axis=2)
        acc_exponent = tl.where(acc == 0.0, -1000, ((acc.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127)
        aligned = tl.maximum(tl.maximum(exponent, acc_exponent), EXPONENT_FLOOR)
        per_unit = _pow2(FRACTION - aligned)
        unit = _pow2(aligned - FRACTION)
        terms = (products * per_unit[:, :, None]).to(tl.int32).to(tl.float32)  # truncated toward zero
        total_step = tl.sum(terms, axis=2) + (acc * per_unit).to(tl.int32).to(tl.float32)  # integers: exact
        acc = ((total_step * unit).to(tl.int32, bitcast=True) & ~mask).to(tl.float32, bitcast=True) + 0.0
        if not FAST:  # a new chain every 128 elements, its result added into FP32
            ends = (step % STEPS_PER_PROMOTION) == STEPS_PER_PROMOTION - 1
            total = tl.where(ends, total + acc, total)
            acc = tl.where(ends, 0.0, acc)
    if not FAST:
        acc = total + acc
    tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def hopper_accumulate_kernel(a: Tensor, b: Tensor, kinds: tuple[FP8Kind, FP8Kind], fast: bool) -> Tensor:
    """``formats.accumulation.hopper_accumulate`` (one split) of a [M, K] and b [N, K] holding FP8
    values: the FP32 accumulator [M, N]."""
    a, b = a.float().contiguous(), b.float().contiguous()
    (m, k), n = a.shape, b.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=a.device)
    grid = (triton.cdiv(m, TILE), triton.cdiv(n, TILE))
    _hopper_kernel[grid](a, b, out, m, n, k, EMIN_A=MIN_NORMAL_EXPONENT[kinds[0]], EMIN_B=MIN_NORMAL_EXPONENT[kinds[1]],
                         FAST=fast, BM=TILE, BN=TILE, BK=BLOCK, STEPS_PER_PROMOTION=PROMOTE_EVERY // BLOCK,
                         FRACTION=FRACTION_BITS, EXPONENT_FLOOR=FLOOR, **launch_options(TILE * TILE * BLOCK))
    return out
