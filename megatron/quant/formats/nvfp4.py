"""NVFP4: E2M1 elements in blocks of 16, an E4M3 scale per block and an FP32 one per tensor.

    global = amax_tensor / (448 * 6)                      (float32; tensor_scale's guards)
    block  = E4M3_RNE((amax_block / 6) / global)          (saturating at 448)
    scale  = block * global;  element = E2M1_RNE(x / scale)

A block whose E4M3 scale rounds to zero (its amax is tiny next to the tensor's) quantizes
to zero. Inf or NaN in a block makes that block NaN, as in MX; a non-finite tensor amax
falls back to global = 1 so that the other blocks are still quantized.
"""
from __future__ import annotations

import torch

from .base import abs_max, tensor_scale
from .blocks import BlockFormat
from .grid import FP4_E2M1, FP8_E4M3

NVFP4_BLOCK_SIZE = 16


class NVFP4Format(BlockFormat):
    name = "nvfp4"
    block_size = NVFP4_BLOCK_SIZE
    scale_encoding = "E4M3 per block, times one FP32 scale per tensor"
    needs_tensor_amax = True
    element = FP4_E2M1
    block_scale_format = FP8_E4M3
    bits = FP4_E2M1.bits
    max_value = FP4_E2M1.max_value
    min_positive = FP4_E2M1.min_positive

    def _quantize_blocks(self, blocks, block_dim, amax, uniform, split):
        block_amax = abs_max(blocks, dim=block_dim)
        global_amax = block_amax.amax() if amax is None else amax  # the padding is zeros
        global_scale = tensor_scale(global_amax, self.block_scale_format.max_value * self.element.max_value)
        block_scale = self.block_scale_format.round(block_amax / self.element.max_value / global_scale)
        scale = torch.where(torch.isfinite(block_amax), block_scale * global_scale, torch.nan)
        scaled = (blocks / scale).masked_fill_(scale == 0, 0.0)
        elements = self.element.round_(scaled, blocks, self.rounding, "saturate", uniform)
        # A GEMM kernel decodes element x E4M3 block scale (exact in bf16) and applies the
        # FP32 global scale to its accumulator.
        decoded = elements.mul_(torch.where(torch.isfinite(block_amax), block_scale, torch.nan) if split else scale)
        return decoded, scale, global_scale
