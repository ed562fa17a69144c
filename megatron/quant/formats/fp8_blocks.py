"""FP8 with one scale per block (Transformer Engine's ``Float8BlockScaling``, DeepSeek-V3 style):
1 x 128 blocks for activations and gradients, 128 x 128 tiles for weights.

Per block, in float32 (TE's current-scaling rule applied to the block amax):

    encode = max_fp8 / amax_block           (1 for an amax of 0; if that overflows FP32, the
                                             input dtype's largest finite value, as TE's
                                             ``compute_scale_from_types``: bf16's for bf16)
    encode = 2**floor(log2(encode))         (``power_of_two_scales``, the default)
    element = saturate(RNE(x * encode));  value = element * (1 / encode)

With power-of-two scales element x scale is exact in bf16. Inf or NaN in a block makes that
block NaN, as in the other block formats; with ``nonfinite="te"`` the block amax skips NaN and
an Inf amax gives encode 1, as TE's kernels (the elements, Inf saturated, are cast normally).
"""
from __future__ import annotations

import torch

from .base import encode_scale
from .blocks import GridBlockFormat
from .contract import BlockScale


class FP8BlockFormat(GridBlockFormat):
    scale_encoding = "FP32 per block (a power of two with power_of_two_scales)"

    def _block_scale(self) -> BlockScale:
        return BlockScale("fp32", power_of_two=self.options["power_of_two_scales"])

    def _quantize_blocks(self, blocks, block_dim, amax, uniform, split, dtype):
        block_amax = self._abs_max(blocks, dim=block_dim)
        encode = encode_scale(block_amax, self.element.max_value, self.options["power_of_two_scales"],
                              torch.finfo(dtype).max)
        scale = 1 / encode
        if self.options["nonfinite"] == "propagate":
            scale = torch.where(torch.isfinite(block_amax), scale, torch.nan)
        elements = self.element.round_(blocks * encode, blocks, self.rounding, "saturate", uniform)
        return elements.mul_(scale), scale, None
