"""The layers on the Triton path: a quantized linear layer's output and gradients are the torch
path's bits for Transformer Engine's recipes (SR on gradients, RHT, 2-D weights, delayed scaling)."""
import pytest
import torch

from megatron.quant.layers.linear import QuantRowParallelLinear
from megatron.quant.layers.ops import LinearQuant
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import transformer_config

pytestmark = pytest.mark.device
SITE = CaptureSite("linear", "linear", 0, "test.linear", "fc2", "test")


@pytest.fixture(scope="module")
def parallel():
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()


def _run(preset: str, device, dtype) -> list[torch.Tensor]:
    layer = QuantRowParallelLinear(64, 48, config=transformer_config(params_dtype=dtype, bf16=dtype == torch.bfloat16),
                                   init_method=torch.nn.init.normal_, bias=False, input_is_parallel=True,
                                   skip_bias_add=False).to(device)
    torch.manual_seed(0)
    torch.nn.init.normal_(layer.weight)
    formats = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset}).resolve("fc2", 0, 1)
    layer.configure_quant(LinearQuant.from_formats(formats), SITE, seed=3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 2, 64, generator=g).to(device, dtype).requires_grad_()
    y, _ = layer(x)
    y.backward(torch.randn(y.shape, generator=g).to(device, dtype))
    return [y.detach(), x.grad, layer.weight.grad], formats


@pytest.mark.parametrize("preset", ["te-nvfp4", "te-mxfp8", "te-fp8-current", "te-fp8-blockwise", "te-fp8-delayed"])
def test_linear_layer_on_triton_kernels_gives_the_torch_path_bits(preset, parallel, kernel_device, monkeypatch):
    from megatron.quant.kernels import blocks

    dtype = torch.bfloat16
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")
    expected, _ = _run(preset, kernel_device, dtype)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    dual_calls = []
    launch_dual = blocks.launch_dual
    monkeypatch.setattr(blocks, "launch_dual", lambda *args, **kw: dual_calls.append(1) or launch_dual(*args, **kw))
    ours, formats = _run(preset, kernel_device, dtype)
    assert {type(f).__name__ for f in formats.values() if f is not None} == {"TritonFormat"}
    for a, b in zip(ours, expected):
        assert torch.equal(a, b)
    # The weight's fprop and dgrad copies and the gradient's dgrad and wgrad copies come from one
    # read where both use one block format along an axis (not 2-D tiles: te-fp8-blockwise's weights).
    assert len(dual_calls) == {"te-mxfp8": 2, "te-fp8-blockwise": 1}.get(preset, 0)
