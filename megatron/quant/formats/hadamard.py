"""Random Hadamard transform (RHT) of groups of n consecutive elements along an axis.

Each group, as a row vector g, becomes ``g @ R`` with ``R = diag(s) @ H_n / sqrt(n)``: H_n is
the Sylvester Hadamard matrix and s a fixed vector of signs. R is orthogonal, so the inverse
is ``y @ R.T``. Along a GEMM's reduction axis the transform cancels: transforming the token
axis of both wgrad operands multiplies them by the same orthogonal block-diagonal B, and
dW = (B dY)^T (B X) = dY^T X.

Default signs: Transformer Engine's fixed NVFP4 wgrad vector for n = 16 (TE
``get_wgrad_sign_vector``), repeated for n > 16 (the 32-vector AMD's Primus-Turbo ships)
and cut to its first n entries for n < 16. The transform runs in float32 as a fast
Walsh-Hadamard butterfly (log2 n add/subtract stages, then the 1/sqrt(n) factor): elementwise
ops in a fixed order, so the same input gives the same bits on any backend, which a matmul,
whose summation order depends on the BLAS kernel, does not.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import torch
from torch import Tensor

TE_SIGNS_16 = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
MAX_SIZE = 256  # a group is at most one block; larger transforms would cost more than the GEMM


def parse_size(value: Any) -> int:
    """``hadamard=n``: a power of two in [2, 256]."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or not 2 <= value <= MAX_SIZE or value & (value - 1)):
        raise ValueError(f"must be a power of two from 2 to {MAX_SIZE}")
    return int(value)


def parse_signs(value: Any) -> tuple[int, ...]:
    """``hadamard_signs``: a list of +1/-1 (its length is checked against ``hadamard``)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError("must be a list of +1 and -1")
    signs = tuple(value)
    if not signs or any(isinstance(s, bool) or s not in (1, -1) for s in signs):
        raise ValueError("must be a list of +1 and -1")
    return tuple(int(s) for s in signs)


def default_signs(n: int) -> tuple[int, ...]:
    return (TE_SIGNS_16 * (-(-n // 16)))[:n]


def sylvester(n: int) -> Tensor:
    """H_n with entries +-1 (float64): H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]]."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def walsh_hadamard(groups: Tensor) -> Tensor:
    """``groups @ H_n`` over the last dimension (length n) by the butterfly, unnormalised."""
    n, half = groups.shape[-1], 1
    while half < n:
        pairs = groups.unflatten(-1, (n // (2 * half), 2, half))
        a, b = pairs.select(-2, 0), pairs.select(-2, 1)
        groups = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        half *= 2
    return groups


@functools.lru_cache(maxsize=None)
def signs_on(signs: tuple[int, ...], device: torch.device) -> Tensor:
    """A sign vector as float32 on ``device``, copied there once (the torch path and the kernels share
    it): a host-to-device copy per quantization waits for the device (a stream sync) and stalls the
    kernel launches queued behind it."""
    return torch.tensor(signs, dtype=torch.float32, device=device)


class Hadamard:
    """The transform for one sign vector (its length is the group size n)."""

    def __init__(self, signs: tuple[int, ...]):
        self.size = len(signs)
        self.sign_values = tuple(signs)
        self.signs = torch.tensor(signs, dtype=torch.float32)
        self.norm = 1 / math.sqrt(self.size)  # exact for n = 4**k; else rounded to float32 in the product

    @property
    def matrix(self) -> Tensor:
        """R = diag(s) @ H_n / sqrt(n) in float32 (for inspection; the transform uses the butterfly)."""
        s = self.signs.double()
        return (s[:, None] * sylvester(self.size) * self.norm).float()

    def forward(self, x: Tensor, axis: int, name: str) -> Tensor:
        """float32 x with every group g along ``axis`` replaced by g @ R."""
        return self._apply(x, axis, name, inverse=False)

    def inverse(self, y: Tensor, axis: int, name: str) -> Tensor:
        """y with every group replaced by g @ R^T = (g @ H_n / sqrt(n)) * s."""
        return self._apply(y, axis, name, inverse=True)

    def check(self, length: int, axis: int, name: str) -> None:
        """ValueError unless ``length`` (x's along ``axis``) is a whole number of groups."""
        if length % self.size:
            raise ValueError(f"{name}: hadamard={self.size} needs the length along axis {axis} ({length}) "
                             f"to be a multiple of {self.size}")

    def _apply(self, x: Tensor, axis: int, name: str, inverse: bool) -> Tensor:
        self.check(x.shape[axis], axis, name)
        groups = x.float().movedim(axis, -1).unflatten(-1, (-1, self.size))
        signs = signs_on(self.sign_values, x.device)
        if inverse:
            groups = walsh_hadamard(groups).mul_(self.norm).mul_(signs)
        else:
            groups = walsh_hadamard(groups * signs).mul_(self.norm)
        return groups.flatten(-2).movedim(-1, axis).contiguous()
