"""The NVFP block formats: elements (E2M1 for NVFP4, E2M3 for NVFP6) in blocks of 16, an E4M3
scale per block and an FP32 one per tensor, with the arithmetic of Transformer Engine's NVFP4
quantization kernels (float32, in this order; ``emax`` is the element's largest value, 6 for
E2M1, 7.5 for E2M3):

    global_encode = (448 * emax) / amax_tensor    (FP32 max if that overflows; 1 for an amax
                                                   of 0, Inf or NaN)
    block_decode  = E4M3_RNE(min(amax_block * (global_encode * (1/emax)), 448))
    global_decode = 1 / global_encode
    encode        = 1 / (block_decode * global_decode)
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
"""
from __future__ import annotations

import torch

from .base import encode_scale
from .blocks import GridBlockFormat
from .contract import BlockScale, TensorScale
from .grid import FP8_E4M3

NVFP_BLOCK_SIZE = 16


class NVFPFormat(GridBlockFormat):
    """An NVFP block format of one element grid (``registry``: ``nvfp4`` E2M1, ``nvfp6`` E2M3)."""

    scale_encoding = "E4M3 per block, times one FP32 scale per tensor"
    needs_tensor_amax = True
    block_scale_format = FP8_E4M3

    def _block_scale(self) -> BlockScale:
        return BlockScale("grid", grid=self.block_scale_format.rule)

    def _tensor_scale(self) -> TensorScale:
        return TensorScale(self.block_scale_format.max_value * self.element.max_value)

    def _quantize_blocks(self, blocks, block_dim, amax, uniform, split, dtype):
        block_amax = self._abs_max(blocks, dim=block_dim)
        global_amax = block_amax.amax() if amax is None else amax  # the padding is zeros
        element_max = self.element.max_value
        global_encode = encode_scale(global_amax, self._tensor_scale().target)
        block_decode = self.block_scale_format.round(block_amax * (global_encode * (1 / element_max)))
        if self.options["nonfinite"] == "propagate":  # "te": an Inf amax saturates to E4M3's 448
            block_decode = torch.where(torch.isfinite(block_amax), block_decode, torch.nan)
        global_decode = 1 / global_encode
        scale = block_decode * global_decode
        scaled = (blocks * (1 / scale)).masked_fill_(scale == 0, 0.0)
        elements = self.element.round_(scaled, blocks, self.rounding, "saturate", uniform)
        decoded = elements.mul_(block_decode)  # exact: what a GEMM kernel decodes
        return (decoded if split else decoded.mul_(global_decode)), scale, global_decode
