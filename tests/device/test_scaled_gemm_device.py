"""On the GPU, the GEMM of narrow operands with an FP32 output sums their products exactly
(``layers.scaled_gemm.matmul``; its shapes and the CPU path: tests/layers/test_scaled_gemm.py)."""
import pytest
import torch

from megatron.quant.layers.scaled_gemm import matmul
from tests.layers.test_scaled_gemm import SHAPES, _operands

pytestmark = pytest.mark.device


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("a_shape, b_shape, view", SHAPES)
def test_on_device_the_fp32_product_is_the_exact_sums(on_gpu, device, a_shape, b_shape, view, dtype):
    a, b = _operands(a_shape, b_shape, view, dtype, device=str(device))
    exact = torch.matmul(a.cpu().to(torch.int64), b.cpu().to(torch.int64))
    out = matmul(a, b, torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out.cpu().to(torch.int64), exact)
