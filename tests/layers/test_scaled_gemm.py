"""The GEMM of two per-tensor-scaled operands: exact products summed in FP32, the scales applied to
that FP32 result, one rounding. On a GPU the bf16/fp16 operands go into one GEMM with an FP32 output
(not widened into an FP32 GEMM, several times slower); its shapes are checked here on the meta
device, its sums on CUDA (``-m device``) and on CPU against integer arithmetic."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.quant.layers.operand import Quantized
from megatron.quant.layers.scaled_gemm import matmul, scaled_product

# (a's shape, b's shape, how b is made from its storage): the linear layers' and attention's GEMMs
SHAPES = [((6, 16), (16, 5), None), ((3, 2, 16), (16, 5), None), ((3, 2, 16), (5, 16), "t"),
          ((16, 6), (16, 5), "a.t"), ((4, 6, 16), (4, 16, 5), None), ((4, 6, 16), (4, 5, 16), "bt")]


def _integers(shape, seed, dtype, device="cpu"):
    """Small integers: exact in bf16, and every sum of their products exact in FP32."""
    return torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _operands(a_shape, b_shape, view, dtype, device="cpu"):
    a, b = _integers(a_shape, 1, dtype, device), _integers(b_shape, 2, dtype, device)
    if view == "t":
        b = b.t()
    elif view == "a.t":
        a = a.t()
    elif view == "bt":
        b = b.transpose(1, 2)
    return a, b


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket.__name__) + "." + func._overloadname)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("a_shape, b_shape, view", SHAPES)
def test_the_fp32_product_of_narrow_operands_is_their_exact_sums(a_shape, b_shape, view):
    a, b = _operands(a_shape, b_shape, view, torch.bfloat16)
    exact = torch.matmul(a.to(torch.int64), b.to(torch.int64))  # the oracle: integer arithmetic
    out = matmul(a, b, torch.float32)
    assert out.dtype == torch.float32 and torch.equal(out.to(torch.int64), exact)
    assert torch.equal(matmul(a, b), torch.matmul(a, b))  # no out_dtype: torch's own product


@pytest.mark.parametrize("a_shape, b_shape, view", SHAPES)
def test_on_a_gpu_the_narrow_operands_go_into_one_gemm_with_an_fp32_output(a_shape, b_shape, view):
    a, b = _operands(a_shape, b_shape, view, torch.bfloat16, device="meta")
    scale = torch.ones((), device="meta")
    with _Ops() as ops:
        out = scaled_product(lambda x, y, dtype: matmul(x, y, dtype), Quantized(a, scale), Quantized(b, scale))
    assert out.shape == torch.matmul(torch.empty(a.shape), torch.empty(b.shape)).shape and out.dtype == torch.bfloat16
    gemm = next(i for i, name in enumerate(ops.names) if name in ("mm.dtype", "bmm.dtype"))
    assert not any(name.startswith("_to_copy") for name in ops.names[:gemm]), ops.names  # nothing widened


def test_scales_apply_to_the_fp32_sums_then_one_rounding():
    a, b = _operands((4, 64), (64, 3), None, torch.bfloat16)
    sa, sb = torch.tensor(1 / 3), torch.tensor(3.0 + 2 ** -20)
    out = scaled_product(lambda x, y, dtype: matmul(x, y, dtype), Quantized(a, sa), Quantized(b, sb))
    sums = torch.matmul(a.to(torch.int64), b.to(torch.int64)).to(torch.float32)  # exact in FP32
    assert out.dtype == torch.bfloat16 and torch.equal(out, (sums * (sa * sb)).to(torch.bfloat16))
    plain = scaled_product(lambda x, y, dtype: matmul(x, y, dtype), Quantized(a), Quantized(b))
    assert torch.equal(plain, torch.matmul(a, b))  # no scales: stock arithmetic, in bf16
