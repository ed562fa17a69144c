"""NVFP6 in the Triton kernels (the block kernel reads the format's contract: E2M3 elements, an E4M3
block scale under the FP32 tensor scale), against the independent reference of tests/formats/test_nvfp6.py
and, for stochastic rounding, 16 x 16 tiles and both axes at once, against the torch path."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits
from tests.formats._nvfp_oracle import nvfp6_reference, nvfp6_test_data
from tests.formats._oracle import mismatches
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

pytestmark = pytest.mark.device


def test_nvfp6_kernel_matches_the_e2m3_grid_and_the_scale_rule(kernel_device):
    x = nvfp6_test_data(rows=100, seed=8)
    expected, operand, decode = nvfp6_reference(x)
    twin = triton_twin(get_format("nvfp6"))
    xt = torch.from_numpy(x).to(kernel_device)
    assert not mismatches(twin.quantize(xt).cpu(), expected, x)
    gemm_operand, tensor_scale = twin.quantize_for_gemm(xt)
    assert not mismatches(gemm_operand.cpu(), operand, x) and tensor_scale.item() == decode


@pytest.mark.parametrize("options", [{"rounding": "stochastic"}, {"block_shape": (16, 16)}, {"hadamard": 16}])
def test_nvfp6_kernel_options_match_the_torch_path(options, kernel_device):
    fmt = get_format("nvfp6", **options)
    twin = triton_twin(fmt)
    noise = RandomBits.derive("nvfp6", 1)
    for dtype in (torch.float32, torch.bfloat16):
        x = wide_values((32, 48), seed=4, dtype=dtype, device=kernel_device, lo=-12, hi=8, specials=False)
        assert_same_result(twin.quantize(x, -1, noise=noise), fmt.quantize(x, -1, noise=noise), f"{dtype}")
        both = zip(twin.quantize_for_gemm_both(x, noises=(noise, noise)),
                   fmt.quantize_for_gemm_both(x, noises=(noise, noise)))
        for axis, (ours, expected) in zip((-2, -1), both):
            assert_same_result(ours, expected, f"{dtype} both axes, axis {axis}")
