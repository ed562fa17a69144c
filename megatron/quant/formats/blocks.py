"""Block-scaled formats: elements in blocks of consecutive values along one axis share a scale."""
from __future__ import annotations

from abc import abstractmethod

import torch
from torch import Tensor

from .base import NumericFormat, normalize_axis


def split_blocks(x: Tensor, axis: int, block_size: int) -> Tensor:
    """x viewed as blocks along ``axis`` (non-negative) without moving it: ``axis`` becomes
    (n_blocks, block_size), so the block dimension is ``axis + 1``.

    Keeping the axis in place keeps every later pass contiguous; moving a middle axis last
    would cost two transposed copies. A length that is not a multiple of ``block_size`` is
    zero-padded, which leaves every block's amax, and so the result, as if the last block
    were simply shorter.
    """
    pad = -x.shape[axis] % block_size
    if pad:
        padding = list(x.shape)
        padding[axis] = pad
        x = torch.cat([x, x.new_zeros(padding)], dim=axis)
    return x.unflatten(axis, (-1, block_size))


def merge_blocks(blocks: Tensor, axis: int, length: int) -> Tensor:
    """Inverse of ``split_blocks`` (contiguous result)."""
    return blocks.flatten(axis, axis + 1).narrow(axis, 0, length).contiguous()


class BlockFormat(NumericFormat):
    """Splits x into blocks along ``axis``; subclasses quantize one (..., n_blocks, block) tensor."""

    scaling = "block"
    scale_encoding: str  # how a block's scale is stored, for listings

    def _quantize(self, x, axis, amax, uniform, split):
        axis = normalize_axis(self.name, axis, x.dim())
        x32 = x.float()
        blocks = split_blocks(x32, axis, self.block_size)
        if uniform is not None:
            uniform = split_blocks(uniform, axis, self.block_size)
        q, scale, tensor_scale = self._quantize_blocks(blocks, axis + 1, amax, uniform, split)
        return merge_blocks(q, axis, x.shape[axis]), scale, tensor_scale

    @abstractmethod
    def _quantize_blocks(self, blocks: Tensor, block_dim: int, amax: Tensor | None, uniform: Tensor | None,
                         split: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """(fake-quantized blocks, per-block scale: ``blocks``' shape with 1 at ``block_dim``, tensor
        scale); ``uniform`` and ``split`` as in ``NumericFormat._quantize``."""

    def _scale_like_input(self, scale, x, axis):
        axis = normalize_axis(self.name, axis, x.dim())
        per_element = list(scale.shape)
        per_element[axis + 1] = self.block_size
        return merge_blocks(scale.expand(per_element), axis, x.shape[axis])
