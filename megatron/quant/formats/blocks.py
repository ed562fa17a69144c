"""Block-scaled formats: elements in blocks of consecutive values along one axis share a scale."""
from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import NumericFormat, normalize_axis


def split_blocks(x: Tensor, axis: int, block_size: int) -> Tensor:
    """x with ``axis`` moved last and cut into blocks: shape (..., n_blocks, block_size).

    A length that is not a multiple of ``block_size`` is zero-padded, which leaves every
    block's amax, and so the result, as if the last block were simply shorter.
    """
    moved = x.movedim(axis, -1)
    pad = -moved.shape[-1] % block_size
    if pad:
        moved = F.pad(moved, (0, pad))
    return moved.reshape(*moved.shape[:-1], -1, block_size)


def merge_blocks(blocks: Tensor, axis: int, length: int) -> Tensor:
    """Inverse of ``split_blocks`` (contiguous result)."""
    return blocks.flatten(-2)[..., :length].movedim(-1, axis).contiguous()


class BlockFormat(NumericFormat):
    """Splits x into blocks along ``axis``; subclasses quantize one (..., n_blocks, block) tensor."""

    scaling = "block"
    scale_encoding: str  # how a block's scale is stored, for listings

    def _quantize(self, x, axis, amax, generator):
        axis = normalize_axis(self.name, axis, x.dim())
        x32 = x.float()
        blocks = split_blocks(x32, axis, self.block_size)
        q, scale = self._quantize_blocks(blocks, amax, generator)
        return merge_blocks(q, axis, x.shape[axis]), scale

    @abstractmethod
    def _quantize_blocks(self, blocks: Tensor, amax: Tensor | None,
                         generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """(fake-quantized blocks, per-block scale of shape (..., n_blocks, 1))."""

    def _scale_like_input(self, scale, x, axis):
        axis = normalize_axis(self.name, axis, x.dim())
        return merge_blocks(scale.expand(*scale.shape[:-1], self.block_size), axis, x.shape[axis])
