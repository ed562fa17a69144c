"""Per-block statistics of a block-scaled operand: how its block scales spread, and how wide each
block's values are, from the format's declared blocks and scale encoding (``kernel_contract``). The
statistics are declared in ``record.BLOCK_KEYS``; this module finds the blocks they are taken over.

``block_scale_stats`` runs over every block (one amax and one min-nonzero per block, vectorised; no
sampling: the scales are the format's, so the fraction of blocks at the scale floor or ceiling is
exact). Blocks without a nonzero finite value are left out, as in ``reference``'s block fields.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from megatron.quant.formats.blocks import blocks_in_order, split_blocks
from megatron.quant.stats import record

if TYPE_CHECKING:
    from megatron.quant.formats.contract import KernelContract
    from megatron.quant.formats.interface import QuantFormat

_FP32 = torch.finfo(torch.float32)
E8M0_LIMITS = (2.0 ** -127, 2.0 ** 127)  # an E8M0 scale's smallest and largest power of two


def scale_limits(contract: "KernelContract") -> tuple[float, float]:
    """The floor and ceiling of a block scale as the format stores it (NVFP4: the E4M3-encoded scale
    under the tensor scale; E8M0: powers of two; FP32 scales: float32's normal range)."""
    encoding = contract.block_scale.encoding
    if encoding == "e8m0":
        return E8M0_LIMITS
    if encoding == "grid":
        grid = contract.block_scale.grid
        return 2.0 ** (grid.min_exponent - grid.mbits), grid.max_value
    return _FP32.tiny, _FP32.max


def block_scale_stats(x: Tensor, fmt: "QuantFormat", axis: int, scale: Tensor,
                      amax: Optional[Tensor] = None) -> Optional[dict]:
    """The per-block statistics (``record.BLOCK_KEYS``) of x quantized by block format ``fmt`` with
    ``scale`` (per element, as ``quantize_with_scale`` gives it); None for formats without blocks.
    ``amax``: the tensor amax the format used (TP-reduced), for the NVFP4 scale's encoding; default:
    x's own."""
    contract = fmt.kernel_contract
    if contract is None or not contract.blocked or scale.dim() == 0:
        return None
    values = fmt.transform(x.detach(), axis) if fmt.transforms_operand else x.detach()
    block_max, block_min, block_scale = _per_block(values, fmt, axis, scale.detach().expand(x.shape))
    used = (block_max > 0) & torch.isfinite(block_scale)
    if not bool(used.any()):
        return record.derive_blocks(None)
    scales = block_scale[used].double()
    floor, ceiling = scale_limits(contract)
    ranges = torch.log2(block_max[used].double()) - torch.log2(block_min[used].double())
    return record.derive_blocks(record.Blocks(scales, _stored(scales, contract, values, amax), floor, ceiling,
                                              torch.log2(scales[scales > 0]), ranges))


def _per_block(values: Tensor, fmt: "QuantFormat", axis: int, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each block's amax and min nonzero |x| (over its finite elements) and scale, flat, in one block
    order. Blocks along an axis are viewed in place (no copy of x or of the per-element scale)."""
    magnitude = values.float().abs()
    if not bool(torch.isfinite(magnitude.amax())):
        magnitude = torch.where(torch.isfinite(magnitude), magnitude, 0.0)
    contract = fmt.kernel_contract
    if contract.tiled:
        rows = blocks_in_order(magnitude, fmt, axis)
        return rows.amax(1), torch.where(rows == 0, math.inf, rows).amin(1), \
            blocks_in_order(scale.float(), fmt, axis)[:, 0]
    axis = axis % values.dim()
    blocks = split_blocks(magnitude, axis, contract.block_size)
    nonzero_min = torch.where(blocks == 0, math.inf, blocks).amin(axis + 1)
    block_scale = split_blocks(scale, axis, contract.block_size).select(axis + 1, 0)
    return blocks.amax(axis + 1).flatten(), nonzero_min.flatten(), block_scale.float().flatten()


def _stored(scales: Tensor, contract: "KernelContract", values: Tensor, amax: Optional[Tensor]) -> Tensor:
    """The block scales as the format stores them: a grid-encoded scale (NVFP4) times the tensor's
    encode factor (target / tensor amax); other encodings store the scale itself."""
    if contract.block_scale.encoding != "grid" or contract.tensor_scale is None:
        return scales
    top = float(values.abs().amax() if amax is None else amax.float().max())
    if not 0 < top < math.inf:
        return scales
    return scales * (contract.tensor_scale.target / top)
