"""``rounding="stochastic8"`` (the hardware's 8-bit draw, ``formats.rounding.round_stochastic_``) in the
Triton kernels: bit for bit against the torch path, for a block format (NVFP4, both axes and the
one-read dual quantization), an elementwise grid (FP8) and bf16's bit rounding."""
import pytest

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits, Shard
from tests.kernels._compare import assert_same_result, triton_twin, wide_values


@pytest.mark.parametrize("name, options", [("nvfp4", {}), ("nvfp4", {"block_shape": (16, 16)}),
                                           ("mxfp8_e4m3", {}), ("fp8_e4m3", {}), ("bf16", {})])
def test_stochastic8_kernels_match_the_torch_path(name, options, kernel_device):
    fmt = get_format(name, rounding="stochastic8", seed=4, **options)
    twin = triton_twin(fmt)
    noise = RandomBits.derive("hw8", name).sharded(Shard(0, 1, 2))
    x = wide_values((48, 64), seed=11, lo=-8, hi=4, device=kernel_device, specials=False)
    for axis in (0, -1):
        assert_same_result(twin.quantize(x, axis, noise=noise), fmt.quantize(x, axis, noise=noise), f"axis {axis}")
    if fmt.block_size is not None:
        noises = (noise, noise.child("other"))
        for ours, expected in zip(twin.quantize_for_gemm_both(x, noises=noises),
                                  fmt.quantize_for_gemm_both(x, noises=noises)):
            assert_same_result(ours, expected, "both axes")
