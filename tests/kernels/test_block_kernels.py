"""MX formats in Triton against the torch path, bit for bit: FP8/FP6/FP4 elements, every scale
mode, blocks along the first, a middle and the last axis, ragged last blocks, 32 x 32 tiles,
Hadamard, NaN/Inf/zero blocks, fp32 and bf16 inputs, round to nearest and stochastic."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.mx import SCALE_MODES
from megatron.quant.formats.random_bits import RandomBits
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

pytestmark = pytest.mark.device

MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4_e2m1"]


def _blocks_input(shape, seed, dtype, device):
    """Wide values with an all-zero block, a NaN block and an Inf block along the last axis."""
    x = wide_values(shape, seed, dtype=torch.float32, specials=False, lo=-20, hi=12)
    flat = x.view(-1, shape[-1])
    flat[0, :32] = 0.0
    flat[1, 3] = float("nan")
    flat[2, 40] = -float("inf")
    flat[3, :32] = torch.linspace(-2.0**-130, 2.0**-128, 32)  # subnormal amax: scale 2**-127
    return x.to(device=device, dtype=dtype)


# Every element format with every scale mode, each pair once; the rounding alternates over that grid, so
# each format and each scale mode meets both roundings (every pair of the three factors is covered: the
# kernel's element, scale and rounding steps are separate stages, tested in full in tests/formats).
MX_CASES = [(name, mode, ("nearest", "stochastic")[(i + j) % 2])
            for i, name in enumerate(MX) for j, mode in enumerate(SCALE_MODES)]


@pytest.mark.parametrize("name, scale_mode, rounding", MX_CASES)
def test_mx_formats_along_every_axis_match_the_torch_path(name, scale_mode, rounding, kernel_device):
    fmt = get_format(name, scale_mode=scale_mode, rounding=rounding, seed=2)
    twin = triton_twin(fmt)
    noise = RandomBits.derive("mx", name)
    for dtype in (torch.float32, torch.bfloat16):
        x = _blocks_input((5, 40, 72), seed=len(name), dtype=dtype, device=kernel_device)  # 72 = 2 x 32 + 8
        for axis in (0, 1, -1):
            ours = twin.quantize(x, axis, noise=noise)
            assert_same_result(ours, fmt.quantize(x, axis, noise=noise), f"{dtype} axis {axis}")


@pytest.mark.parametrize("options", [{"block_shape": (32, 32)}, {"hadamard": 32}, {"block_shape": (1, 24)},
                                     {"block_shape": (32, 32), "rounding": "stochastic"}, {"nonfinite": "te"},
                                     {"nonfinite": "te", "scale_mode": "even", "rounding": "stochastic"}])
def test_mx_tiles_hadamard_and_other_block_sizes(options, kernel_device):
    fmt = get_format("mxfp8_e4m3", **options)
    twin = triton_twin(fmt)
    for dtype in (torch.float32, torch.bfloat16):
        x = _blocks_input((2, 40, 64), seed=9, dtype=dtype, device=kernel_device)  # tiles: 40 rows are ragged
        for call in ("quantize", "quantize_for_gemm"):
            assert_same_result(getattr(twin, call)(x, -1), getattr(fmt, call)(x, -1), f"{call} {dtype}")


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("options", [{}, {"power_of_two_scales": False}, {"block_shape": (128, 128)},
                                     {"block_shape": (128, 128), "power_of_two_scales": False},
                                     {"block_shape": (1, 32), "hadamard": 16}, {"nonfinite": "te"}],
                         ids=["1x128", "1x128-fp32-scales", "128x128", "128x128-fp32-scales", "1x32-hadamard", "te"])
@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_blockwise_matches_the_torch_path(name, options, rounding, kernel_device):
    fmt = get_format(name, scaling="block", rounding=rounding, **options)
    twin = triton_twin(fmt)
    for dtype in (torch.float32, torch.bfloat16):
        # Ragged 128-blocks and tiles (the middle axis takes the MX tests' path).
        x = _blocks_input((136, 144), seed=4, dtype=dtype, device=kernel_device)
        x[5, :128] = torch.linspace(-2.0**-128, 2.0**-129, 128)  # max / amax overflows: FP32's max
        for axis in ((0, -1) if fmt.block_shape[0] == 1 and "hadamard" not in options else (-1,)):
            ours = twin.quantize_for_gemm(x, axis)
            assert_same_result(ours, fmt.quantize_for_gemm(x, axis), f"{dtype} axis {axis}")


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("options", [{}, {"block_shape": (16, 16)}, {"hadamard": 16}, {"nonfinite": "te"}])
def test_nvfp4_matches_the_torch_path(options, rounding, kernel_device):
    """1x16 blocks along the first, a middle and the last axis, 16 x 16 tiles, hadamard=16; with the
    tensor's own amax and a given (TP-reduced) one; blocks whose E4M3 scale rounds to zero."""
    fmt = get_format("nvfp4", rounding=rounding, **options)
    twin = triton_twin(fmt)
    for dtype in (torch.float32, torch.bfloat16):
        x = _blocks_input((3, 40, 48), seed=6, dtype=dtype, device=kernel_device)
        x[1, 7, :16] = -(2.0**-15)  # next to an amax of 2**12 its E4M3 scale rounds to zero (-0 kept)
        axes = (-1,) if options else (0, 1, -1)
        finite = x.nan_to_num(0.0, 0.0, 0.0)  # a finite tensor amax: a real FP32 tensor scale
        cases = [(x, a, None) for a in axes] + [(finite, -1, None), (x, -1, torch.tensor(2.0**13, device=x.device))]
        for x, axis, amax in cases:
            for call in ("quantize", "quantize_for_gemm"):
                assert_same_result(getattr(twin, call)(x, axis, amax), getattr(fmt, call)(x, axis, amax),
                                   f"{call} {dtype} axis {axis} amax {amax}")


@pytest.mark.parametrize("name, options", [
    ("mxfp8_e4m3", {}), ("mxfp4_e2m1", {"scale_mode": "rceil", "rounding": "stochastic"}),
    ("mxfp8_e5m2", {"nonfinite": "te"}), ("fp8_e4m3", {"scaling": "block"}),
    ("fp8_e5m2", {"scaling": "block", "power_of_two_scales": False, "rounding": "stochastic"}),
    ("nvfp4", {}), ("nvfp4", {"rounding": "stochastic", "nonfinite": "te"}), ("nvfp4", {"block_shape": (16, 16)}),
    ("nvfp4", {"hadamard": 16})])
def test_both_axes_from_one_read_match_two_single_axis_calls(name, options, kernel_device):
    """One kernel quantizes a 2-D tensor along axis 0 and axis 1 (the weight for fprop and dgrad, the
    gradient for dgrad and wgrad), each with its own noise: the torch path's two results."""
    fmt = get_format(name, **options)
    twin = triton_twin(fmt)
    noises = (RandomBits.derive("dgrad"), RandomBits.derive("wgrad"))
    for dtype in (torch.float32, torch.bfloat16):
        # Ragged blocks on both axes (Hadamard needs whole groups); small: the interpreter runs a program per tile.
        shape = (48, 64) if "hadamard" in options else (136, 144) if fmt.block_size == 128 else (40, 56)
        x = _blocks_input(shape, seed=12, dtype=dtype, device=kernel_device)
        both = twin.quantize_for_gemm_both(x, noises=noises)
        for axis in (0, 1):
            expected = fmt.quantize_for_gemm(x, axis, noise=noises[axis])
            assert_same_result(both[axis], expected, f"{dtype} axis {axis}")
    assert twin.dual_axis == ("block_shape" not in options and "hadamard" not in options)
