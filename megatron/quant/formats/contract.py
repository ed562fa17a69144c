"""``KernelContract``: what a quantization kernel needs to know of a format, as frozen data.

A format declares its contract (``QuantFormat.kernel_contract``; None where no kernel serves it);
the kernels and their launchers read the contract, never the format's class. The contract says
how values are rounded (the element grid as a ``GridRule``, the overflow rule, the rounding), how
they are grouped (``block_shape``), where their scales come from (``BlockScale``, ``TensorScale``)
and what is applied first (``Transform``). ``kernels.constants`` turns it into the kernels'
constants, in one place; ``to_json`` is how it travels through a torch operator's schema
(``kernels.ops``), written from the dataclasses' fields (``frozen_json``), and ``from_json`` reads it back.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from . import frozen_json
from .grid import GridRule, Overflow
from .rounding import Rounding

BlockScaleEncoding = Literal["e8m0", "fp32", "grid"]
"""How a block's scale follows from its amax. ``"e8m0"``: a power of two, by the MX scale mode
(``formats.mx``); ``"fp32"``: ``max / amax`` in float32, maybe rounded down to a power of two
(``formats.fp8_blocks``); ``"grid"``: ``amax * (tensor encode / element max)`` rounded onto a scale
grid (E4M3), under the per-tensor FP32 scale (``formats.nvfp``)."""
ScaleChoice = Literal["mae", "mse"]
"""How NVFP4's 4over6 picks a block's scale (``formats.nvfp``): of the two candidates, scaling the block
amax to 4 or to 6, the one with the lower sum of absolute (``"mae"``) or squared (``"mse"``) errors."""


@dataclass(frozen=True)
class BlockScale:
    """A block format's per-block scale."""

    encoding: BlockScaleEncoding
    scale_mode: str = "floor"  # e8m0: the MX scale mode (``formats.mx.SCALE_MODES``)
    power_of_two: bool = False  # fp32: the encode factor rounded down to a power of two
    grid: Optional[GridRule] = None  # grid: the grid the scale is rounded onto
    four_over_six: Optional[ScaleChoice] = None  # grid: choose per block between amax -> 4 and amax -> 6


@dataclass(frozen=True)
class TensorScale:
    """A per-tensor scale: ``encode = target / amax`` (``formats.base.encode_scale``), decoded by
    ``1 / encode``; the amax is the tensor's own, or the caller's (delayed scaling's history)."""

    target: float
    power_of_two: bool = False
    per_row: bool = False  # one FP32 scale per row (the line along the block axis) instead of per tensor


@dataclass(frozen=True)
class Transform:
    """A random Hadamard transform of groups of ``size`` along the quantization axis
    (``formats.hadamard``): signs, butterfly, ``norm``."""

    size: int
    signs: tuple[int, ...]
    norm: float


@dataclass(frozen=True)
class KernelContract:
    """Everything a kernel reads of a format."""

    name: str  # for messages
    element: GridRule
    overflow: Overflow
    rounding: Rounding
    nonfinite_te: bool  # the ``nonfinite="te"`` rule: amaxes skip NaN, an Inf amax gives a finite scale
    overflow_bound: tuple[float, bool]  # ``saturation.overflow_bound``: what the statistics count as overflow
    block_shape: Optional[tuple[int, int]] = None  # None: elementwise
    block_scale: Optional[BlockScale] = None
    tensor_scale: Optional[TensorScale] = None
    transform: Optional[Transform] = None
    unchanged_dtype: Optional[torch.dtype] = None  # inputs of this dtype are already on the grid (casts)

    @property
    def blocked(self) -> bool:
        return self.block_shape is not None

    @property
    def tiled(self) -> bool:
        return self.block_shape is not None and self.block_shape[0] > 1

    @property
    def block_size(self) -> int:
        return self.block_shape[1]

    @property
    def fused_transform(self) -> bool:
        """True when a block kernel applies the transform itself: its groups are the blocks along
        the axis (TE's NVFP4 wgrad RHT of 16, MX's 32)."""
        return (self.transform is not None and self.blocked and not self.tiled
                and self.transform.size == self.block_size)

    @property
    def per_row(self) -> bool:
        """True when the FP32 scale above the block scales is one per row, not one per tensor."""
        return self.tensor_scale is not None and self.tensor_scale.per_row

    @property
    def dual_axis(self) -> bool:
        """True when one kernel quantizes along both of the last two axes from one read: blocks
        along an axis and no transform (the blocks of both axes are in every square tile), each block
        scaled from its own amax and one tensor scale (not per row, no 4over6 choice)."""
        return (self.blocked and not self.tiled and self.transform is None and not self.per_row
                and self.block_scale.four_over_six is None)

    def to_json(self) -> str:
        """The contract as a JSON string, derived from its fields (``frozen_json``; ``from_json`` reads it back)."""
        return frozen_json.to_json(self)


@functools.lru_cache(maxsize=None)
def from_json(text: str) -> KernelContract:
    """The ``KernelContract`` that ``KernelContract.to_json`` wrote."""
    return frozen_json.from_json(KernelContract, text)
