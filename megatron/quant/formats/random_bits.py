"""Stateless random bits for stochastic rounding: noise is a pure function of a key and of
each element's index in the *global* (unsharded) tensor.

    u(key, i) = top 24 bits of mix(mix(i * GOLDEN xor k0) xor k1) / 2**24

``mix`` is a 32-bit integer hash with full avalanche (Wellons' "lowbias32"); two rounds keyed
by the two halves of a 64-bit key make streams with different keys unrelated (a collision
needs both halves equal). Everything is vectorised int32 arithmetic that wraps like the
hardware's, so CPU and GPU, eager and compiled, produce the same bits, and nothing is drawn
from a stateful generator: the same key and index give the same noise in any process, at
any tensor-parallel size, after any checkpoint resume.

Keys are derived with ``derive(...)`` from any mix of ints and strings (seed, module name,
operand, iteration, micro-batch); the derivation is a cryptographic hash in Python, once
per call, never on the tensor path. Element indices wrap at 2**32: an operand whose global
tensor holds more than 4.3e9 elements reuses noise (none of Llama's does).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor

_GOLDEN = -1640531535   # 0x9E3779B1 as int32: spreads consecutive indices over the 32 bits
_MIX_1 = 0x7FEB352D
_MIX_2 = -2073254261    # 0x846CA68B as int32
_UNIFORM_BITS = 24      # float32 holds a 24-bit fraction exactly


def as_int32(word: int) -> int:
    """A 32-bit word as the signed int32 with the same bits."""
    word &= 0xFFFFFFFF
    return word - (1 << 32) if word >= 1 << 31 else word


def _shift_right_(x: Tensor, bits: int, scratch: Tensor) -> Tensor:
    """Logical right shift of int32 x into ``scratch`` (torch shifts int32 arithmetically)."""
    return torch.bitwise_right_shift(x, bits, out=scratch).bitwise_and_((1 << (32 - bits)) - 1)


def _mix_(x: Tensor, scratch: Tensor) -> Tensor:
    """lowbias32 on int32 in place: x ^= x >> 16; x *= C1; x ^= x >> 15; x *= C2; x ^= x >> 16."""
    x.bitwise_xor_(_shift_right_(x, 16, scratch)).mul_(_MIX_1)
    x.bitwise_xor_(_shift_right_(x, 15, scratch)).mul_(_MIX_2)
    return x.bitwise_xor_(_shift_right_(x, 16, scratch))


@dataclass(frozen=True)
class Shard:
    """x is the ``rank``-th of ``world`` equal slices along ``dim`` of a global tensor.

    ``groups`` > 1: ``dim`` holds ``groups`` consecutive runs, each the rank's slice of its own
    run of the global dimension (e.g. attention's [batch * heads] with heads split across ranks).
    """

    dim: int
    rank: int
    world: int
    groups: int = 1


def global_index(shape: tuple[int, ...], device: torch.device, shard: Optional[Shard] = None) -> Tensor:
    """int32 index (mod 2**32) of every element of a local tensor of ``shape`` in its global
    tensor, in row-major order; the local index when ``shard`` is None."""
    if shard is None or shard.world == 1:
        dim, before, rank, world, groups = 0, 1, 0, 1, 1
    else:
        dim = shard.dim % len(shape)
        before, rank, world, groups = math.prod(shape[:dim]), shard.rank, shard.world, shard.groups
    length = shape[dim] if shape else 1
    after = math.prod(shape[dim + 1:]) if shape else 1
    if length % groups:
        raise ValueError(f"dimension {dim} of {tuple(shape)} does not split into {groups} groups")
    local = length // groups
    # Global layout (before, groups, world * local, after); this rank owns [rank * local, (rank + 1) * local).
    small = before * groups * world * local * after < 1 << 31  # int32 arithmetic cannot overflow
    arange = lambda n: torch.arange(n, dtype=torch.int32 if small else torch.int64, device=device)  # noqa: E731
    row = (arange(before * groups) * (world * local * after)).view(-1, 1, 1)
    within = ((arange(local) + rank * local) * after).view(1, -1, 1)
    index = (row + within + arange(after).view(1, 1, -1)).view(shape)
    return index if small else _wrap32(index)


def _wrap32(index: Tensor) -> Tensor:
    """int64 -> int32 keeping the low 32 bits (a plain cast saturates on some backends)."""
    low = index & 0xFFFFFFFF
    return torch.where(low >= 1 << 31, low - (1 << 32), low).to(torch.int32)


@dataclass(frozen=True)
class RandomBits:
    """Keyed, stateless U[0, 1) noise for a tensor; see the module docstring.

    ``derive`` makes a key from parts, ``child`` a sub-stream, ``sharded`` says which slice of
    the global tensor the local one is, and ``uniform`` gives the noise.
    """

    key: int  # 64 bits
    shard: Optional[Shard] = None

    @classmethod
    def derive(cls, *parts: int | str) -> "RandomBits":
        text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts).encode()
        return cls(int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little"))

    def child(self, *parts: int | str) -> "RandomBits":
        """An independent stream named by ``parts`` under this one (same shard)."""
        return replace(RandomBits.derive(self.key, *parts), shard=self.shard)

    def sharded(self, shard: Optional[Shard]) -> "RandomBits":
        return replace(self, shard=shard)

    def uniform(self, shape: tuple[int, ...], device: torch.device | str) -> Tensor:
        """float32 noise in [0, 1) with 24-bit resolution, one value per element of ``shape``."""
        x = global_index(tuple(shape), torch.device(device), self.shard)
        scratch = torch.empty_like(x)
        x.mul_(_GOLDEN).bitwise_xor_(as_int32(self.key))
        _mix_(x, scratch).bitwise_xor_(as_int32(self.key >> 32))
        _mix_(x, scratch)
        top = _shift_right_(x, 32 - _UNIFORM_BITS, scratch)
        return top.to(torch.float32).mul_(2.0**-_UNIFORM_BITS)
