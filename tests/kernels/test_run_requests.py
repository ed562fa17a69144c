"""``TritonFormat.run`` answers each ``Want`` with the torch path's bits, where the fields land: both
axes from one read with the requested axis first, and statistics asked for without the scale."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.quantization import GEMM_BOTH_AXES, Want
from megatron.quant.formats.random_bits import RandomBits
from tests.kernels._compare import assert_same_bits, triton_twin, wide_values

pytestmark = pytest.mark.device


def test_both_axes_from_one_read_put_the_requested_axis_first(kernel_device):
    fmt = get_format("mxfp8_e4m3", rounding="stochastic", seed=3)
    twin = triton_twin(fmt)
    assert twin.dual_axis
    x = wide_values((64, 96), seed=4, device=kernel_device, specials=False)
    first, second = RandomBits.derive("first", 1), RandomBits.derive("second", 2)
    for axis, other in ((-1, -2), (1, 0), (-2, -1), (0, 1)):
        done = twin.run(x, axis, want=GEMM_BOTH_AXES, noise=first, cross_noise=second)
        assert_same_bits(done.operand, fmt.run(x, axis, want=Want(gemm=True), noise=first).operand, f"axis {axis}")
        assert_same_bits(done.cross.operand, fmt.run(x, other, want=Want(gemm=True), noise=second).operand,
                         f"cross of axis {axis}")


def test_statistics_without_the_scale(kernel_device):
    fmt = get_format("nvfp4")
    twin = triton_twin(fmt)
    x = wide_values((16, 64), seed=5, device=kernel_device, specials=False)
    done = twin.run(x, -1, want=Want(stats="full"))
    assert done.scale is None and done.stats is not None and done.stats.dtype == torch.float64
    assert_same_bits(done.value, fmt.quantize(x, -1))
    _, _, packed = twin.quantize_with_stats(x, -1, full=True)
    assert torch.equal(done.stats, packed)
