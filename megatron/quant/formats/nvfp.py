"""The NVFP block formats: elements (E2M1 for NVFP4, E2M3 for NVFP6) in blocks of 16, an E4M3
scale per block and an FP32 one per tensor, with the arithmetic of Transformer Engine's NVFP4
quantization kernels (float32, in this order; ``emax`` is the element's largest value, 6 for
E2M1, 7.5 for E2M3):

    global_encode = (448 * emax) / amax_tensor    (FP32 max if that overflows; 1 for an amax
                                                   of 0, Inf or NaN)
    block_decode  = E4M3_RNE(min(amax_block * (global_encode * (1/emax)), 448))
    global_decode = 1 / global_encode
    encode        = min(1 / (block_decode * global_decode), FP32 max)
    element       = ELEMENT_RNE(clamp(x * encode, +-emax))
    value         = (element * block_decode) * global_decode

The reported scale is block_decode * global_decode (so the elements are x * (1 / scale)).
A block whose E4M3 scale rounds to zero (its amax is tiny next to the tensor's) quantizes
to zero. Inf or NaN in a block makes that block NaN, as in MX; with ``nonfinite="te"`` the
amaxes skip NaN (fmaxf) and an Inf block amax saturates the E4M3 scale to 448, as TE's
kernels (``core_nvfp4.cuh``), the elements being cast normally. ``quantize_for_gemm`` returns
element * block_decode (exact in bf16) and global_decode as the tensor scale.
``block_shape=(16, 16)`` shares one scale per 16 x 16 tile (TE's weights); ``hadamard=16``
quantizes TE's random Hadamard transform of x.

Transformer Engine's 2026 NVFP4 options (``NVFP4BlockScaling``; the arithmetic of its reference
quantizer ``pytorch/custom_recipes/reference_nvfp4.py``, ``NVFP4QuantizerRef``), NVFP4 only:

- ``four_over_six="mae"|"mse"`` (TE's ``nvfp4_4over6`` with ``nvfp4_4over6_err_mode``): per block
  (1 x 16 or 16 x 16) two candidates, scaling the block amax to 6 and to 4,

      base = (amax_block / 6) * global_encode
      d6   = E4M3_RNE(min(base, 448));   d4 = E4M3_RNE(min(base * 1.5, 448))
      q    = E2M1_RNE(clamp(x * min(1 / (d * global_decode), FP32 max), +-6))
      err  = sum over the block of |v - x| (mae) or (v - x)**2 (mse),
             v = ((q * d) * amax_tensor) / (6 * e4m3_max)

  summed in TE's order (a 1 x 16 block left to right; a tile row by row, then the 16 row sums
  pairwise as a warp reduces them); the map-to-4 candidate wins only when its error is lower.
  Tiles quantized along axis -2 (W^T, the copy the data-gradient GEMM reads) are W^T's tiles: their
  rows are W's columns, so W^T chooses from its own sums (``reference_nvfp4.py`` transposes before it
  quantizes columnwise) and may choose otherwise than W on a near-tie.
  ``e4m3_max=256`` (TE's default for 4over6, ``nvfp4_4over6_e4m3_use_256``) puts 256 in place of
  448 in global_encode (so the map-to-4 scale stays below 448); 448 keeps the standard bound.
  TE defines 4over6 without the Hadamard transform and without stochastic rounding.
- ``row_scaled=True`` (TE's ``row_scaled_activation``): the FP32 scale is one per row, the line of
  x along the block axis (``amax_tensor`` is that row's amax), in 1 x 16 blocks only. The row's
  factor is not split off for the GEMM: ``quantize_for_gemm`` returns the values with it applied
  (TE applies it to the FP32 accumulator per output row).

Values decode as (element * block_decode) * global_decode for every option (TE's dequantize kernel
multiplies by block_decode * amax * (1 / (6 * e4m3_max)) instead, which can differ in the last bit).
NVFP4 with UE5M3 block scales is not offered: no TE source defines its arithmetic.
"""
from __future__ import annotations

from typing import Any, Optional, get_args

import torch
from torch import Tensor

from .base import encode_scale, normalize_axis
from .blocks import GridBlockFormat
from .contract import BlockScale, ScaleChoice, TensorScale
from .grid import FP8_E4M3
from .rounding import is_stochastic

NVFP_BLOCK_SIZE = 16
FOUR_OVER_SIX_MODES = ("off", *get_args(ScaleChoice))  # the ``four_over_six`` option: off, or its error
E4M3_BOUNDS = (448, 256)  # the global E4M3 bound: standard, or 4over6's
FOUR_OVER_SIX_SHAPES = ((1, 16), (16, 16))
MAP_TO_FOUR = 1.5  # 6 / 4: the map-to-4 block scale is the map-to-6 one times this
FP32_MAX = torch.finfo(torch.float32).max  # TE's bound on an encode factor (1 / a zero scale)


def check_options(name: str, options: dict[str, Any]) -> None:
    """ValueError, naming the option, for NVFP option combinations TE defines no arithmetic for."""
    four_over_six = options.get("four_over_six", "off") != "off"
    if options.get("e4m3_max", 448) != 448 and not four_over_six:
        raise ValueError(f"{name}: e4m3_max={options['e4m3_max']} needs four_over_six='mae' or 'mse' "
                         f"(TE's 256 bound is a 4over6 option)")
    if four_over_six:
        if options["block_shape"] not in FOUR_OVER_SIX_SHAPES:
            raise ValueError(f"{name}: four_over_six needs block_shape (1, 16) or (16, 16), "
                             f"not {options['block_shape']}")
        if is_stochastic(options.get("rounding", "nearest")) or options.get("hadamard") is not None:
            raise ValueError(f"{name}: four_over_six takes neither a stochastic rounding (rounding="
                             f"{options.get('rounding', 'nearest')!r}) nor hadamard={options.get('hadamard')!r} "
                             f"(TE's 4over6 has no stochastic rounding and no RHT)")
    if options.get("row_scaled") and options["block_shape"][0] > 1:
        raise ValueError(f"{name}: row_scaled needs blocks along an axis (block_shape (1, n)), "
                         f"not tiles {options['block_shape']}")


class NVFPFormat(GridBlockFormat):
    """An NVFP block format of one element grid (``registry``: ``nvfp4`` E2M1, ``nvfp6`` E2M3)."""

    scale_encoding = "E4M3 per block, times one FP32 scale per tensor (or per row)"
    needs_tensor_amax = True
    block_scale_format = FP8_E4M3

    def __init__(self, name: str, element, options: dict):
        super().__init__(name, element, options)
        check_options(name, self.options)
        self.amax_per_row = bool(self.options.get("row_scaled", False))
        mode = self.options.get("four_over_six", "off")
        self.four_over_six: Optional[str] = None if mode == "off" else mode
        self.axis_free = self.tiled and self.four_over_six is None  # 4over6 tiles sum along the axis
        self.eager_chunks = self.eager_chunks and not self.amax_per_row  # chunks share one tensor amax

    def _block_scale(self) -> BlockScale:
        return BlockScale("grid", grid=self.block_scale_format.rule, four_over_six=self.four_over_six)

    def _tensor_scale(self) -> TensorScale:
        bound = self.options.get("e4m3_max", self.block_scale_format.max_value)
        return TensorScale(float(bound) * self.element.max_value, per_row=self.amax_per_row)

    def amax_of(self, x: Tensor, axis: int = -1) -> Tensor:
        """As ``NumericFormat.amax_of``; row-scaled: each row's, x's shape with 1 at ``axis``."""
        if not self.amax_per_row:
            return super().amax_of(x, axis)
        axis = normalize_axis(self.name, axis, x.dim())
        return self._abs_max(self.transform(x, axis), dim=axis)

    def _quantize(self, x, axis, amax, uniform, split):
        """As ``BlockFormat._quantize``; 4over6 tiles along axis -2 (W^T, the data-gradient GEMM's copy)
        are W^T's own tiles, choosing from W^T's error sums, as TE quantizes its columnwise copy."""
        axis = normalize_axis(self.name, axis, x.dim())
        if not (self.tiled and self.four_over_six and axis == x.dim() - 2):
            return super()._quantize(x, axis, amax, uniform, split)
        q, scale, tensor_scale = super()._quantize(x.transpose(-1, -2), axis + 1, amax, uniform, split)
        return q.transpose(-1, -2).contiguous(), scale.transpose(-3, -2), tensor_scale

    def _global_amax(self, block_amax: Tensor, block_dim: int, amax: Optional[Tensor]) -> Tensor:
        """The tensor's amax (0-d), or each row's (``block_amax``'s shape with 1 at the block index)."""
        if not self.amax_per_row:
            return block_amax.amax() if amax is None else amax  # the padding is zeros
        if amax is None:
            return block_amax.amax(block_dim - 1, keepdim=True)
        return amax.to(torch.float32).unsqueeze(block_dim)  # ``amax_of``'s layout: 1 at the axis

    def _quantize_blocks(self, blocks, block_dim, amax, uniform, split, dtype):
        block_amax = self._abs_max(blocks, dim=block_dim)
        global_amax = self._global_amax(block_amax, block_dim, amax)
        target = self._tensor_scale().target
        global_encode = encode_scale(global_amax, target)
        global_decode = 1 / global_encode
        if self.four_over_six is None:
            block_decode = self.block_scale_format.round(block_amax * (global_encode * (1 / self.element.max_value)))
            block_decode = self._nonfinite_blocks(block_decode, block_amax)
            scale = block_decode * global_decode
            scaled = (blocks * (1 / scale).clamp_(max=FP32_MAX)).masked_fill_(scale == 0, 0.0)
            elements = self.element.round_(scaled, blocks, self.rounding, "saturate", uniform)
        else:
            elements, block_decode = self._four_over_six(blocks, block_dim, block_amax, global_amax, global_encode,
                                                         global_decode, target)
            block_decode = self._nonfinite_blocks(block_decode, block_amax)
            scale = block_decode * global_decode
        decoded = elements.mul_(block_decode)  # exact: what a GEMM kernel decodes
        if self.amax_per_row:  # the rows' factors stay in the values (see the module docstring)
            return decoded.mul_(global_decode), scale, None
        return (decoded if split else decoded.mul_(global_decode)), scale, global_decode

    def _nonfinite_blocks(self, block_decode: Tensor, block_amax: Tensor) -> Tensor:
        """NaN scales for blocks holding Inf or NaN (``nonfinite="te"``: an Inf amax saturates to 448)."""
        if self.options["nonfinite"] == "te":
            return block_decode
        return torch.where(torch.isfinite(block_amax), block_decode, torch.nan)

    def _four_over_six(self, blocks: Tensor, block_dim: int, block_amax: Tensor, global_amax: Tensor,
                       global_encode: Tensor, global_decode: Tensor, target: float) -> tuple[Tensor, Tensor]:
        """(elements, block decode scales) of the better candidate per block (module docstring)."""
        base = (block_amax / torch.full_like(block_amax, self.element.max_value)) * global_encode
        candidates = []
        for decode in (self.block_scale_format.round(base * MAP_TO_FOUR), self.block_scale_format.round(base)):
            encode = (1 / (decode * global_decode)).clamp_(max=FP32_MAX)
            elements = self.element.round_(blocks * encode, blocks, "nearest", "saturate")
            values = ((elements * decode) * global_amax) / torch.full_like(blocks, target)
            diff = values.sub_(blocks)
            error = diff.abs_() if self.four_over_six == "mae" else diff.mul_(diff)
            candidates.append((elements, decode, self._block_error(error, block_dim)))
        (q4, d4, e4), (q6, d6, e6) = candidates
        map_to_four = e4 < e6  # ties keep map-to-6
        return torch.where(map_to_four, q4, q6), torch.where(map_to_four, d4, d6)

    def _block_error(self, error: Tensor, block_dim: int) -> Tensor:
        """A block's summed error in TE's order, kept as a dimension of 1 at ``block_dim``: along a
        1 x 16 block left to right; in a 16 x 16 tile each row left to right, then the rows pairwise."""
        side = self.block_size
        if not self.tiled:
            total = error.narrow(block_dim, 0, 1).clone()
            for i in range(1, side):
                total += error.narrow(block_dim, i, 1)
            return total
        rows = error.unflatten(-1, (side, side))  # (..., row, column): tiles are flattened row by row
        sums = rows[..., 0].clone()
        for i in range(1, side):
            sums += rows[..., i]
        while sums.shape[-1] > 1:
            half = sums.shape[-1] // 2
            sums = sums[..., :half] + sums[..., half:]
        return sums
