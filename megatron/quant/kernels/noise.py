"""Triton device functions for stochastic rounding: ``formats.random_bits``'s keyed hash of the
global element index, computed in the kernel. The key is a runtime argument (two int32 halves),
so a new key never recompiles; the arithmetic is that module's int32 arithmetic, op for op."""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from megatron.quant.formats.random_bits import RandomBits, as_int32


@triton.jit
def _mix(x):
    """lowbias32 on int32 (logical shifts as arithmetic shifts masked, as random_bits does)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * -2073254261
    return x ^ ((x >> 16) & 0xFFFF)


@triton.jit
def global_index(offsets, after, local, rank_offset, row_stride):
    """int32 (mod 2**32) global index of local row-major ``offsets`` (``random_bits.global_index``):
    the local tensor is (rows, local, after) of a global (rows, row_stride / after)."""
    i = offsets.to(tl.int64)
    inner = i % after
    rest = i // after
    index = (rest // local) * row_stride + (rest % local + rank_offset) * after + inner
    return (index & 0xFFFFFFFF).to(tl.int32)


@triton.jit
def uniform(index, key_low, key_high):
    """U[0, 1) with 24-bit resolution, as ``RandomBits.uniform``."""
    x = (index * -1640531535) ^ key_low
    x = _mix(x) ^ key_high
    x = _mix(x)
    top = (x >> 8) & 0xFFFFFF
    return top.to(tl.float32) * (1.0 / 16777216.0)


def noise_args(bits: Optional[RandomBits], shape: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """(key low, key high, after, local, rank offset, row stride) for ``global_index``/``uniform``:
    what ``RandomBits.uniform(shape)`` keys on, as kernel arguments."""
    if bits is None:
        return 0, 0, 1, 1, 0, 1
    shard = bits.shard
    if shard is None or shard.world == 1:  # the local index: ones, which the kernels' launches take as constants
        after, local, rank_offset, row_stride = 1, 1, 0, 1
    else:
        dim = shard.dim % len(shape)
        after = 1
        for size in shape[dim + 1:]:
            after *= size
        if shape[dim] % shard.groups:
            raise ValueError(f"dimension {dim} of {tuple(shape)} does not split into {shard.groups} groups")
        local = shape[dim] // shard.groups
        rank_offset, row_stride = shard.rank * local, shard.world * local * after
    return as_int32(bits.key), as_int32(bits.key >> 32), after, local, rank_offset, row_stride
