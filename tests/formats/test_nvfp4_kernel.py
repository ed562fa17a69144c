"""NVFP4 with Transformer Engine's kernel arithmetic, against a step-by-step numpy restatement
(``_blocks_oracle.nvfp4_blocks_reference``): ties, E4M3 scale boundaries, the global scale's
guards, the GEMM split, and a block the previous order put on another E4M3 scale."""
import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from tests.formats._blocks_oracle import (
    nvfp4_blocks_reference,
    nvfp4_divide_block_scale,
    nvfp4_global_encode,
    nvfp4_reference,
)
from tests.formats._oracle import element_values, mismatches

E4M3 = element_values("fp8_e4m3")
E2M1 = element_values("fp4_e2m1")


def _boundary_blocks(global_amax: float, seed: int) -> np.ndarray:
    """Blocks whose amax makes amax * (encode / 6) land on, and one float32 ulp around, every
    E4M3 value and every midpoint between two (the scale's rounding ties), each filled
    with E2M1 ties of that scale."""
    rng = np.random.default_rng(seed)
    encode = nvfp4_global_encode(global_amax)
    factor = encode * np.float32(1 / 6)
    midpoints = (E4M3[1:] + E4M3[:-1]) / 2
    targets = np.concatenate([E4M3[1:], midpoints]).astype(np.float32)
    amaxes = np.concatenate([targets / factor, np.nextafter(targets / factor, 0),
                             np.nextafter(targets / factor, np.inf)])
    amaxes = amaxes[amaxes <= global_amax].astype(np.float32)
    ties = ((E2M1[1:] + E2M1[:-1]) / 2).astype(np.float32)
    blocks = rng.choice(np.concatenate([ties, -ties, E2M1, -E2M1]), (amaxes.size, 16)).astype(np.float32)
    blocks = blocks * (amaxes / 6)[:, None]  # ties of the nominal scale amax / 6 ...
    blocks[:, 0] = amaxes * rng.choice([-1, 1], amaxes.size)  # ... in a block of exactly that amax
    return blocks.astype(np.float32)


@pytest.mark.parametrize("global_amax", [2688.0, 1.0, 3.7e5, 1e-3, 448.0 * 6 * 2.0**-20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_arithmetic_over_ties_and_e4m3_boundaries(global_amax, dtype):
    blocks = _boundary_blocks(global_amax, seed=int(global_amax * 7) % 1000)
    x = torch.from_numpy(blocks).to(dtype)
    x32 = x.float().numpy()
    amax = torch.tensor(global_amax, dtype=torch.float32)
    q, scale = get_format("nvfp4").quantize_with_scale(x, amax=amax)
    expected_q, expected_scale = nvfp4_blocks_reference(x32, amax.numpy())
    assert not mismatches(q, torch.from_numpy(expected_q).to(dtype), x32)
    assert not mismatches(scale, expected_scale)
    assert (expected_scale[:, 0] > 0).mean() > 0.9  # nearly all boundary blocks get a usable scale


@pytest.mark.parametrize("amax, expected", [(0.0, 1.0), (float("inf"), 1.0), (float("nan"), 1.0),
                                            (1e-45, np.finfo(np.float32).max), (2688.0, 1.0), (5376.0, 0.5)])
def test_global_encode_guards(amax, expected):
    assert nvfp4_global_encode(amax) == np.float32(expected)
    x = torch.tensor([[1e-45] + [0.0] * 15]) if amax == 1e-45 else torch.linspace(-1, 1, 16)[None]
    _, tensor_scale = get_format("nvfp4").quantize_for_gemm(x, amax=torch.tensor(amax))
    assert tensor_scale.item() == np.float32(1) / np.float32(expected)


def test_quantize_is_the_gemm_operand_times_the_tensor_scale():
    rng = np.random.default_rng(3)
    x = torch.from_numpy((rng.standard_normal((64, 96)) * np.exp2(rng.integers(-6, 6, (64, 1)))).astype(np.float32))
    fmt = get_format("nvfp4")
    for dtype in (torch.float32, torch.bfloat16):
        operand, tensor_scale = fmt.quantize_for_gemm(x.to(dtype))
        assert operand.dtype == dtype and tensor_scale.dtype == torch.float32 and tensor_scale.dim() == 0
        exact = fmt.quantize_for_gemm(x.to(dtype).float())[0]  # float32 input: no rounding of the operand
        assert torch.equal(operand.float(), exact)  # element * E4M3 scale is exact in bf16
        q = fmt.quantize(x.to(dtype).float())
        assert torch.equal(q, exact * tensor_scale)  # (element * block_decode) * global_decode


def test_the_previous_order_can_pick_another_e4m3_scale():
    """(amax_block / 6) / (amax / 2688) against amax_block * ((2688 / amax) * (1/6)): scan for
    blocks where the two float32 orders round to different E4M3 values, and check ours."""
    global_amax = np.float32(3.3)
    encode = nvfp4_global_encode(global_amax)
    factor = encode * np.float32(1 / 6)
    midpoints = ((E4M3[1:] + E4M3[:-1]) / 2).astype(np.float32)  # where the E4M3 rounding flips
    near = (midpoints / factor).astype(np.float32)
    candidates = near[:, None].view(np.int32) + np.arange(-8, 9, dtype=np.int32)  # a few ulps around
    candidates = candidates.ravel().view(np.float32)
    candidates = candidates[(candidates > 0) & (candidates <= global_amax)]
    kernel = np.asarray(candidates * factor).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    previous = nvfp4_divide_block_scale(candidates, global_amax)
    differ = np.flatnonzero(kernel != previous)
    assert differ.size > 0, "no block found where the orders differ"
    amax_block = candidates[differ[0]]
    x = torch.zeros(2, 16)
    x[0, 0], x[1, 0] = float(global_amax), float(amax_block)
    _, scale = get_format("nvfp4").quantize_with_scale(x)
    block_decode = scale[1, 0].item() * encode  # back to the E4M3 value (the global factors cancel)
    assert (np.isclose(block_decode, kernel[differ[0]], rtol=1e-6)
            and not np.isclose(block_decode, previous[differ[0]], rtol=1e-3))


def test_zero_scale_blocks_are_zero_and_non_finite_blocks_nan():
    x = torch.zeros(3, 16)
    x[0] = torch.linspace(-1000, 1000, 16)
    x[1, :4] = 1e-6  # block amax * (encode / 6) is far below E4M3's smallest subnormal
    x[2, 3] = float("inf")
    q, scale = get_format("nvfp4").quantize_with_scale(x, amax=torch.tensor(1000.0))
    assert scale[1, 0].item() == 0 and torch.equal(q[1], torch.zeros(16))
    assert torch.isnan(q[2]).all() and torch.isfinite(q[:2]).all()
    expected, _ = nvfp4_reference(x.numpy(), np.float32(1000.0))
    assert not mismatches(q, expected)
