"""NVFP4's 4over6 and row-scaled options in Triton against the torch path (itself against TE's reference
quantizer: tests/formats/test_nvfp4_te_options.py), bit for bit: normal, heavy-tailed, all-zero and
tiny-amax inputs, blocks along the first and the last axis (ragged last blocks), 16 x 16
tiles, a given (TP-reduced) amax, the GEMM operand and the statistics pass."""
import pytest
import torch

from megatron.quant.formats import get_format
from tests.kernels._compare import assert_same_result, triton_twin

pytestmark = pytest.mark.device

# (options, input, dtype): every option against each kind of input somewhere (the interpreter is slow).
CASES = [
    (dict(four_over_six="mae", e4m3_max=256), "normal", torch.float32),
    (dict(four_over_six="mae", e4m3_max=256), "tiny", torch.bfloat16),
    (dict(four_over_six="mse"), "heavy", torch.bfloat16),
    (dict(four_over_six="mse"), "zero", torch.float32),
    (dict(four_over_six="mse", e4m3_max=256, block_shape=(16, 16)), "heavy", torch.bfloat16),
    (dict(four_over_six="mae", block_shape=(16, 16), nonfinite="te"), "normal", torch.float32),
    (dict(row_scaled=True), "heavy", torch.bfloat16),
    (dict(row_scaled=True), "tiny", torch.float32),
    (dict(row_scaled=True, four_over_six="mae", e4m3_max=256), "normal", torch.float32),
    (dict(row_scaled=True, hadamard=16, rounding="stochastic"), "heavy", torch.bfloat16),
]


def _inputs(kind: str, dtype: torch.dtype, device, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    shape = (2, 16, length)  # ragged last blocks along every axis but for Hadamard's whole groups
    x = torch.randn(shape, generator=g)
    if kind == "heavy":
        x = x * torch.exp(2.5 * torch.randn(shape, generator=g))
        x[0, 3] = 0.0  # an all-zero row
    elif kind == "zero":
        x = torch.zeros(shape)
    elif kind == "tiny":  # the global encode overflows to FP32 max
        x = x * 1e-38
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("options, kind, dtype", CASES,
                         ids=["-".join([*(f"{k}={v}" for k, v in o.items()), kind]) for o, kind, _ in CASES])
def test_te_nvfp4_options_match_the_torch_path(options, kind, dtype, kernel_device):
    fmt = get_format("nvfp4", **options)
    twin = triton_twin(fmt)
    x = _inputs(kind, dtype, kernel_device, 32 if "hadamard" in options else 40)
    for axis in ((-1,) if fmt.tiled or "hadamard" in options else (0, -1)):
        for call in ("quantize", "quantize_for_gemm"):
            assert_same_result(getattr(twin, call)(x, axis), getattr(fmt, call)(x, axis), f"{call} axis {axis}")
    assert_same_result(twin.quantize_with_scale(x, -1), fmt.quantize_with_scale(x, -1), "with the statistics pass")
    amax = fmt.amax_of(x, -1) * 2  # a given amax, as the layers pass a TP-reduced one
    assert_same_result(twin.quantize(x, -1, amax), fmt.quantize(x, -1, amax), "given amax")
    assert_same_result(twin.amax_of(x, -1), fmt.amax_of(x, -1), "amax_of")
    assert not twin.dual_axis


def test_4over6_tiles_along_the_first_axis_are_the_transposed_tiles(kernel_device):
    """W^T's 4over6 tiles choose from W^T's own error sums in the kernel as in the torch path (itself
    against TE's reference quantizer on a near-tie: tests/formats/test_nvfp4_te_options.py)."""
    from tests.formats.test_nvfp4_te_options import near_tie

    fmt = get_format("nvfp4", four_over_six="mae", block_shape=(16, 16))
    twin = triton_twin(fmt)
    x = near_tie().to(kernel_device)
    for axis in (0, -1):
        assert_same_result(twin.quantize_for_gemm(x, axis), fmt.quantize_for_gemm(x, axis), f"axis {axis}")
        assert_same_result(twin.quantize_with_scale(x, axis), fmt.quantize_with_scale(x, axis), f"scales {axis}")
    assert not torch.equal(twin.quantize(x, 0), twin.quantize(x, -1))
