"""Which formats the quantized flash attention kernels (``flash_attention``) apply to the tiles they
quantize themselves, P and dS, and their constants: an elementwise grid without a tensor scale (HiF8,
FP8 unscaled, bf16) or MX blocks (E8M0 scales) of 16 or 32 along the key or query axis, round to
nearest, no transform (``covers``). Nothing here imports Triton: the layers ask it which path to take.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from megatron.quant.formats.interface import QuantFormat

from . import constants

TILE_BLOCKS = (16, 32)  # MX block sizes the tiles hold whole (they divide the kernels' 64 x 64 tiles)


@dataclass(frozen=True)
class TileFormat:
    """How the kernel quantizes one [queries, keys] tile operand: ``kind`` 0 not at all, 1 elementwise
    onto ``grid``, else MX blocks of ``kind`` elements (``scale``, ``scale_grid``: ``constants``)."""

    kind: int = 0
    grid: Optional[constants.Grid] = None
    scale: Optional[constants.BlockScale] = None
    scale_grid: Optional[constants.Grid] = None

    def args(self, prefix: str) -> dict:
        """The kernel's constexpr arguments for this operand, named ``prefix``_KIND, _GRID, ..."""
        return {f"{prefix}_KIND": self.kind, f"{prefix}_GRID": self.grid, f"{prefix}_SCALE": self.scale,
                f"{prefix}_SGRID": self.scale_grid}


@dataclass(frozen=True)
class TileFormats:
    """The formats of the tiles the kernels quantize, from the recipe's attention operands."""

    probs: TileFormat = TileFormat()  # P along the keys: O = P V (pv.probs)
    probs_by_queries: TileFormat = TileFormat()  # P along the queries: dV = P^T dO (dv.probs)
    grads: TileFormat = TileFormat()  # dS along the keys: dQ = dS K (dq.grad_scores)
    grads_by_queries: TileFormat = TileFormat()  # dS along the queries: dK = dS^T Q (dk.grad_scores)


def covers(fmt: Optional[QuantFormat]) -> bool:
    """True when the kernels can quantize a tile with ``fmt`` (None: not quantized)."""
    if fmt is None:
        return True
    contract = fmt.kernel_contract
    if contract is None or contract.rounding != "nearest" or contract.tensor_scale is not None \
            or contract.transform is not None:
        return False
    return not contract.blocked or (not contract.tiled and contract.block_scale.encoding == "e8m0"
                                    and contract.block_size in TILE_BLOCKS)


def tile_format(fmt: Optional[QuantFormat]) -> TileFormat:
    """The ``TileFormat`` of a format the kernels ``cover``."""
    if not covers(fmt):
        raise ValueError(f"{fmt.name}: the flash attention kernels quantize P and dS only with an elementwise format "
                         f"without a tensor scale or MX blocks of {TILE_BLOCKS}, round to nearest")
    if fmt is None:
        return TileFormat()
    contract = fmt.kernel_contract
    grid = constants.element_grid(contract)
    if not contract.blocked:
        return TileFormat(1, grid)
    return TileFormat(contract.block_size, grid, constants.block_scale(contract, torch.float32),
                      constants.scale_grid(contract))


def tile_formats(probs: Optional[QuantFormat], probs_by_queries: Optional[QuantFormat], grads: Optional[QuantFormat],
                 grads_by_queries: Optional[QuantFormat]) -> Optional[TileFormats]:
    """The ``TileFormats`` of the recipe's pv.probs, dv.probs, dq.grad_scores and dk.grad_scores formats;
    None when the kernels do not cover one of them."""
    fmts = (probs, probs_by_queries, grads, grads_by_queries)
    if not all(covers(fmt) for fmt in fmts):
        return None
    return TileFormats(*(tile_format(fmt) for fmt in fmts))
