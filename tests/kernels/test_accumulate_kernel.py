"""The Hopper accumulation model's Triton kernel (``kernels.accumulate``) against the torch model
(``formats.accumulation``, itself against mmaemu: tests/formats/test_hopper_accumulation.py), bit for
bit: fast and promoted, E4M3 and E5M2 operands, ragged K and tiles, zeros, subnormals, the largest
values and heavy tails (in Triton's interpreter on CPU; compiled with ``--device cuda``)."""
import pytest
import torch

from megatron.quant.formats.accumulation import Operands, hopper_accumulate

pytestmark = pytest.mark.device

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8(shape, kind, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))
    x[0, :7] = 0.0
    x[-1, :5] = torch.tensor([2.0 ** -9, -(2.0 ** -8), 448.0, -448.0, 3 * 2.0 ** -9])
    return x.clamp(-448, 448).to(DTYPES[kind]).float()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "promoted"])
@pytest.mark.parametrize("m, n, k, kinds", [(5, 7, 48, ("e4m3", "e4m3")), (17, 3, 300, ("e5m2", "e4m3"))])
def test_kernel_equals_the_torch_model(kernel_device, fast, m, n, k, kinds):
    from megatron.quant.kernels.accumulate import hopper_accumulate_kernel

    a, b = fp8((m, k), kinds[0], k), fp8((n, k), kinds[1], k + 1)
    out = hopper_accumulate_kernel(a.to(kernel_device), b.to(kernel_device), kinds, fast).cpu()
    assert torch.equal(out.view(torch.int32), hopper_accumulate(Operands(a, b, *kinds), fast).view(torch.int32))
