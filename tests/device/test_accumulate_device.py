"""On a Hopper GPU, the linear GEMMs' Hopper accumulation runs on the tensor core itself
(``torch._scaled_mm``); here it is compared with the model (``formats.accumulation``) on shapes that
cuBLAS does not split (small M x N, K up to 4096: mmaemu's measured table records no split for them).
Where cuBLAS splits K, the two may differ in the order the splits' FP32 sums are added."""
import pytest
import torch

from megatron.quant.formats.accumulation import Operands, hopper_accumulate
from megatron.quant.layers.scaled_gemm import HopperAccumulator, on_hopper

pytestmark = pytest.mark.device

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "promoted"])
@pytest.mark.parametrize("kinds", [("e4m3", "e4m3"), ("e5m2", "e4m3")], ids=["e4m3xe4m3", "e5m2xe4m3"])
@pytest.mark.parametrize("k", [32, 256, 4096])
def test_the_tensor_core_adds_as_the_model(device, fast, kinds, k):
    if not on_hopper(torch.empty(0, device=device)):
        pytest.skip("needs a Hopper GPU (sm_90): the model describes its FP8 tensor cores")
    g = torch.Generator().manual_seed(k)
    a = (torch.randn(16, k, generator=g) * torch.exp(2 * torch.randn(16, k, generator=g)))
    b = torch.randn(32, k, generator=g)
    a = a.clamp(-448, 448).to(DTYPES[kinds[0]]).float()
    b = b.to(DTYPES[kinds[1]]).float()
    on_card = HopperAccumulator(fast, kinds)(a.to(device), b.t().to(device)).cpu()
    model = hopper_accumulate(Operands(a, b, *kinds), fast)
    assert torch.equal(on_card.view(torch.int32), model.view(torch.int32))
