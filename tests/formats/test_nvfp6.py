"""NVFP6 (E2M3 elements in blocks of 16, an E4M3 block scale, an FP32 tensor scale: NVFP4 with a wider
element), the torch path against an independent reference (``_nvfp_oracle``: ml_dtypes' grids and the
scale rule by hand), bit for bit. The kernels' twin of this test: tests/kernels/test_nvfp6_kernels.py."""
import numpy as np
import torch

from megatron.quant.formats import get_format
from tests.formats._nvfp_oracle import TARGET, nvfp6_reference, nvfp6_test_data
from tests.formats._oracle import mismatches


def test_nvfp6_matches_the_e2m3_grid_and_the_scale_rule():
    x = nvfp6_test_data(rows=400, seed=6)
    expected, operand, decode = nvfp6_reference(x)
    fmt = get_format("nvfp6")
    assert not mismatches(fmt.quantize(torch.from_numpy(x)), expected, x)
    gemm_operand, tensor_scale = fmt.quantize_for_gemm(torch.from_numpy(x))
    assert not mismatches(gemm_operand, operand, x) and tensor_scale.item() == decode
    assert np.count_nonzero(expected) > x.size // 4  # the comparison is not one of zeros


def test_nvfp6_along_the_first_axis_and_with_the_callers_amax():
    x = nvfp6_test_data(rows=160, seed=7)
    fmt = get_format("nvfp6")
    expected = np.ascontiguousarray(nvfp6_reference(x, amax=TARGET / 4)[0].T)
    ours = fmt.quantize(torch.from_numpy(np.ascontiguousarray(x.T)), axis=0, amax=torch.tensor(float(TARGET / 4)))
    assert not mismatches(ours, expected, x.T)
