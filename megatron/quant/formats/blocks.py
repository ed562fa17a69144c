"""Block-scaled formats: elements in blocks of consecutive values along one axis (1 x n), or
in square n x n tiles of the last two dimensions, share a scale."""
from __future__ import annotations

import functools
import numbers
from abc import abstractmethod
from typing import Any, Optional

import torch
from torch import Tensor

from .base import NumericFormat, normalize_axis
from .contract import BlockScale, KernelContract, TensorScale
from .interface import QuantFormat


def parse_block_shape(value: Any) -> tuple[int, int]:
    """``block_shape``: (1, n) for blocks along the axis, (n, n) for tiles; also as a list
    (YAML) or a string "1x16" / "16x16"."""
    if isinstance(value, str):
        parts = value.lower().split("x")
        value = tuple(int(p) if p.strip().isdigit() else p for p in parts)
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1 for v in value)
            or value[0] not in (1, value[1])):
        raise ValueError("must be (1, n) (blocks along the axis) or (n, n) (tiles of the last two "
                         "dimensions), as a pair, a list or a string like '16x16'")
    return int(value[0]), int(value[1])


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


def split_tiles(x: Tensor, side: int) -> Tensor:
    """The last two dimensions (M, N) of x as (M/side, N/side, side * side) tiles, each
    flattened row by row; M and N are zero-padded to multiples of ``side``."""
    pad_rows, pad_cols = -x.shape[-2] % side, -x.shape[-1] % side
    if pad_rows or pad_cols:
        x = torch.nn.functional.pad(x, (0, pad_cols, 0, pad_rows))
    tiles = x.unflatten(-1, (-1, side)).unflatten(-3, (-1, side))  # (..., M/s, s, N/s, s)
    return tiles.transpose(-3, -2).flatten(-2)


def merge_tiles(tiles: Tensor, side: int, rows: int, cols: int) -> Tensor:
    """Inverse of ``split_tiles`` (contiguous result of the unpadded shape)."""
    x = tiles.unflatten(-1, (side, side)).transpose(-3, -2).flatten(-2).flatten(-3, -2)
    return x[..., :rows, :cols].contiguous()


def blocks_in_order(x: Tensor, fmt: Optional[QuantFormat], axis: int) -> Tensor:
    """x's elements as a (blocks, elements) matrix, one row a quantization block of ``fmt`` (blocks
    along ``axis``, or tiles), its elements in order; rows in the order the block kernels number
    blocks (along-axis blocks: before the axis, block index, after the axis, the last fastest;
    tiles: matrix, tile row, tile column); each row zero-padded to a power of two. Formats without
    blocks (and ``fmt`` None): one element a row, in x's own order."""
    block_size = None if fmt is None else fmt.block_size
    if block_size is None:
        return x.reshape(-1, 1)
    if fmt.tiled:
        rows = split_tiles(x, block_size).reshape(-1, block_size * block_size)
    else:
        axis = normalize_axis(fmt.name, axis, x.dim())
        rows = split_blocks(x, axis, block_size).movedim(axis + 1, -1).reshape(-1, block_size)
    pad = (1 << (rows.shape[1] - 1).bit_length()) - rows.shape[1]
    return torch.nn.functional.pad(rows, (0, pad)) if pad else rows


class BlockFormat(NumericFormat):
    """Splits x into blocks along ``axis`` (``block_shape`` (1, n)) or into n x n tiles of its last
    two dimensions, whatever the axis (``block_shape`` (n, n): W and W^T quantize alike);
    subclasses quantize one (..., n_blocks, block) tensor. ``block_size`` is n either way: the
    length of a block along any axis."""

    scaling = "block"
    scale_encoding: str  # how a block's scale is stored, for listings

    def __init__(self, options: dict[str, Any]):
        super().__init__(options)
        self.block_shape = options["block_shape"]
        self.block_size = self.block_shape[1]
        self.tiled = self.block_shape[0] > 1
        self.axis_free = self.tiled
        self.eager_chunks = not self.tiled  # the chunking cuts rows, which would split tiles

    @functools.cached_property
    def kernel_contract(self) -> KernelContract:
        return self._contract(self.element.rule, "saturate", block_shape=self.block_shape,
                              block_scale=self._block_scale(), tensor_scale=self._tensor_scale())

    @abstractmethod
    def _block_scale(self) -> BlockScale:
        """How a block's scale is encoded (the kernels' rule of it)."""

    def _tensor_scale(self) -> TensorScale | None:
        """The per-tensor scale above the block scales (None: blocks alone)."""
        return None

    def _quantize(self, x, axis, amax, uniform, split):
        axis = normalize_axis(self.name, axis, x.dim())
        x32 = x.float()
        if self.tiled:
            return self._quantize_tiles(x32, amax, uniform, split, x.dtype)
        blocks = split_blocks(x32, axis, self.block_size)
        if uniform is not None:
            uniform = split_blocks(uniform, axis, self.block_size)
        q, scale, tensor_scale = self._quantize_blocks(blocks, axis + 1, amax, uniform, split, x.dtype)
        return merge_blocks(q, axis, x.shape[axis]), scale, tensor_scale

    def _quantize_tiles(self, x32, amax, uniform, split, dtype):
        if x32.dim() < 2:
            raise ValueError(f"{self.name}: block_shape={self.block_shape} needs a tensor with at least two dimensions")
        tiles = split_tiles(x32, self.block_size)
        if uniform is not None:
            uniform = split_tiles(uniform, self.block_size)  # noise keeps its element's global index
        q, scale, tensor_scale = self._quantize_blocks(tiles, tiles.dim() - 1, amax, uniform, split, dtype)
        return merge_tiles(q, self.block_size, *x32.shape[-2:]), scale, tensor_scale

    @abstractmethod
    def _quantize_blocks(self, blocks: Tensor, block_dim: int, amax: Tensor | None, uniform: Tensor | None,
                         split: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor | None]:
        """(fake-quantized blocks, per-block scale: ``blocks``' shape with 1 at ``block_dim``, tensor
        scale); ``uniform`` and ``split`` as in ``NumericFormat._quantize``; ``dtype``: the input's
        (``blocks`` are float32 copies)."""

    def expand_scale(self, scale, x, axis):
        if self.tiled:
            per_element = scale.expand(*scale.shape[:-1], self.block_size**2)
            return merge_tiles(per_element, self.block_size, *x.shape[-2:])
        axis = normalize_axis(self.name, axis, x.dim())
        per_element = list(scale.shape)
        per_element[axis + 1] = self.block_size
        return merge_blocks(scale.expand(per_element), axis, x.shape[axis])


class GridBlockFormat(BlockFormat):
    """Blocks of one element grid, chosen at construction (MX elements, FP8 blocks)."""

    def __init__(self, name: str, element, options: dict):
        super().__init__(options)
        self._describe_elements(name, element)
