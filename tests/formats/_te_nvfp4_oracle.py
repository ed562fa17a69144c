"""Transformer Engine's NVFP4 reference quantizer, restated from its source for the tests (nothing of
megatron.quant): ``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` at TE commit
d0067d0 (2026-08), ``NVFP4QuantizerRef``:

- ``cast_to_fp4x2`` (lines 49-73): E2M1 codes by TE's own comparison table (round to nearest even);
- ``_quantize(…)`` (lines 879-896): the global amax per tensor, or per row (``row_scaled_nvfp4``);
- ``_quantize_blockwise_reference`` (lines 651-777): block amaxes (16 x 16 tiles repeated over their
  rows), the global encode scale with its guards, the standard E4M3 block scale;
- ``_quantize_blockwise_4over6_reference`` (lines 524-648) and ``_sum_4over6_2d_error``
  (lines 513-521): the map-to-4 and map-to-6 candidates, their MAE/MSE in the input's domain (the
  non-fast-math path), summed in TE's order, ties to map-to-6.

It quantizes a float32 matrix row-wise (blocks along its last dimension), as TE's rowwise usage does.
"""
from __future__ import annotations

import torch

F32 = torch.float32
FP4_MAX = torch.tensor(6.0)
E4M3_MAX = torch.tensor(448.0)
FP32_MAX = torch.tensor(torch.finfo(F32).max)
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def cast_to_fp4(x: torch.Tensor) -> torch.Tensor:
    """E2M1 values of clipped x by TE's comparison table (its codes, decoded)."""
    code = torch.zeros_like(x, dtype=torch.long)
    table = [((x >= 0.0) & (x <= 0.25), 0), ((x > 0.25) & (x < 0.75), 1), ((x >= 0.75) & (x <= 1.25), 2),
             ((x > 1.25) & (x < 1.75), 3), ((x >= 1.75) & (x <= 2.5), 4), ((x > 2.5) & (x < 3.5), 5),
             ((x >= 3.5) & (x <= 5.0), 6), (x > 5.0, 7), ((x >= -0.25) & (x < -0.0), 8),
             ((x < -0.25) & (x > -0.75), 9), ((x <= -0.75) & (x >= -1.25), 10), ((x < -1.25) & (x > -1.75), 11),
             ((x <= -1.75) & (x >= -2.5), 12), ((x < -2.5) & (x > -3.5), 13), ((x <= -3.5) & (x >= -5.0), 14),
             (x < -5.0, 15)]
    for where, value in table:
        code[where] = value
    return FP4_VALUES[code]


def _e4m3(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(v, min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn).to(F32)


def _sum_2d(err: torch.Tensor) -> torch.Tensor:
    """``_sum_4over6_2d_error``: err (m, blocks, 1) -> (m / 16, blocks, 1), rows summed as a warp."""
    rows = err.view(err.shape[0] // 16, 16, err.shape[1])
    rows = rows[:, 0:8] + rows[:, 8:16]
    rows = rows[:, 0:4] + rows[:, 4:8]
    rows = rows[:, 0:2] + rows[:, 2:4]
    return (rows[:, 0] + rows[:, 1]).unsqueeze(-1)


def te_nvfp4(x: torch.Tensor, tile: tuple[int, int] = (1, 16), row_scaled: bool = False,
             four_over_six: str | None = None, e4m3_max: int = 448
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(element values (m, n), E4M3 block decode scales (m, n / 16), global decode: 1 / global encode,
    (1,) or per row (m, 1)) of float32 x (m, n), n a multiple of 16 (m of 16 for tiles)."""
    m, n = x.shape
    tile_y, tile_x = tile
    global_amax = x.abs().amax(dim=1).view(m, 1, 1) if row_scaled else x.abs().max().view(1)
    if tile == (16, 16):
        tiles = x.unfold(0, 16, 16).unfold(1, 16, 16)
        vec_max = tiles.abs().amax(dim=(-1, -2)).repeat_interleave(16, dim=0).unsqueeze(-1)
    else:
        vec_max = x.view(m, n // tile_x, tile_x).abs().amax(dim=-1, keepdim=True)
    xb = x.view(m, n // tile_x, tile_x)
    bound = torch.tensor(float(e4m3_max if four_over_six else 448))
    global_encode = torch.min(torch.div(bound * FP4_MAX, global_amax), FP32_MAX)
    global_encode = torch.where(global_encode == 0.0, torch.ones_like(global_encode), global_encode)
    global_decode = torch.div(1.0, global_encode)
    if four_over_six is None:
        decode = _e4m3(torch.min(vec_max * (global_encode * torch.reciprocal(FP4_MAX)), FP32_MAX))
        encode = torch.min(torch.div(1.0, decode * global_decode), FP32_MAX)
        elements = cast_to_fp4(torch.clamp(xb * encode, -FP4_MAX, FP4_MAX))
    else:
        base = torch.div(vec_max, FP4_MAX) * global_encode
        candidates = []
        for decode in (_e4m3(base * 1.5), _e4m3(base)):
            encode = torch.min(torch.div(1.0, decode * global_decode), FP32_MAX)
            fp4 = cast_to_fp4(torch.clamp(xb * encode, -FP4_MAX, FP4_MAX))
            err = torch.zeros_like(vec_max)
            sf = decode.squeeze(-1)
            amax = global_amax.squeeze(-1) if row_scaled else global_amax
            for idx in range(tile_x):
                diff = ((fp4[:, :, idx] * sf) * amax) / (FP4_MAX * bound) - xb[:, :, idx]
                err = err + (diff * diff if four_over_six == "mse" else torch.abs(diff)).unsqueeze(-1)
            candidates.append((fp4, decode, err))
        (q4, d4, e4), (q6, d6, e6) = candidates
        pick4 = e4 < e6 if tile_y == 1 else (_sum_2d(e4) < _sum_2d(e6)).repeat_interleave(16, dim=0)
        elements, decode = torch.where(pick4, q4, q6), torch.where(pick4, d4, d6)
    return elements.reshape(m, n), decode.squeeze(-1), global_decode.reshape(m, 1) if row_scaled else global_decode
