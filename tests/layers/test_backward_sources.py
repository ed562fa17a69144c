"""Transformer Engine's per-direction settings in a linear layer, against a reference from the formats
and a plain matmul: ``backward_override`` (``high_precision``: backward GEMMs on the original tensors;
``dequantized``: on the forward's dequantized operands) and hybrid operands (``columnwise_source:
rowwise_dequantized``: dgrad's weight and wgrad's input quantized from the forward's dequantized ones)."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.layers.linear import QuantColumnParallelLinear
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import gemm, operand, transformer_config

IN, OUT, SEQ, BATCH = 64, 96, 16, 2
SITE = CaptureSite("linear", "linear", 0, "test.linear", "fc1", "test")


def _layer(recipe: QuantRecipe) -> QuantColumnParallelLinear:
    layer = QuantColumnParallelLinear(IN, OUT, config=transformer_config(), init_method=torch.nn.init.normal_,
                                      bias=False, gather_output=False)
    layer.configure_quant(LinearQuant.from_formats(recipe.resolve("fc1", 0, 2), recipe.dequantized_sources()), SITE)
    return layer


def _dequantized(x: torch.Tensor, fmt, axis: int) -> torch.Tensor:
    values, scale = operand(x, fmt, axis)
    return values if scale is None else (values.float() * scale).to(values.dtype)


def _run(layer, x, grad):
    x = x.clone().requires_grad_()
    y, _ = layer(x)
    y.backward(grad)
    return y.detach(), x.grad, layer.weight.grad


def _data():
    g = torch.Generator().manual_seed(4)
    return torch.randn(SEQ, BATCH, IN, generator=g), torch.randn(SEQ, BATCH, OUT, generator=g)


def _reference(recipe: QuantRecipe, x, w, grad):
    f, sources = recipe.resolve("fc1", 0, 2), recipe.dequantized_sources()
    w_dgrad = _dequantized(w, f["fprop.weight"], 1) if "dgrad.weight" in sources else w
    x2, dy2 = x.reshape(-1, IN), grad.reshape(-1, OUT)
    x_wgrad = _dequantized(x2, f["fprop.input"], -1) if "wgrad.input" in sources else x2
    y = gemm(lambda a, c: torch.matmul(a, c.t()), operand(x, f["fprop.input"], -1), operand(w, f["fprop.weight"], 1))
    dx = gemm(torch.matmul, operand(grad, f["dgrad.grad_output"], -1), operand(w_dgrad, f["dgrad.weight"], 0))
    dw = gemm(lambda a, c: a.t().matmul(c), operand(dy2, f["wgrad.grad_output"], 0),
              operand(x_wgrad, f["wgrad.input"], 0))
    return y, dx, dw


HYBRID = {"format": "mxfp8", "options": {"scale_mode": "rceil"},  # MXFP8 forward, NVFP4 backward (no SR)
          "operands": {key: "nvfp4" for key in ("dgrad.grad_output", "dgrad.weight", "wgrad.grad_output",
                                                "wgrad.input")}}


@pytest.mark.parametrize("data", [
    {"format": "te-mxfp8-bwd-hp"},
    {"format": "te-mxfp8-bwd-dq"},
    {"format": "nvfp4", "backward_override": "dequantized"},
    {**HYBRID, "columnwise_source": {"weight": "rowwise_dequantized"}},
    {**HYBRID, "columnwise_source": {"weight": "rowwise_dequantized", "input": "rowwise_dequantized"}},
], ids=["bwd-hp", "bwd-dq", "nvfp4-bwd-dq", "hybrid-weight", "hybrid-both"])
def test_each_gemm_takes_the_operands_the_recipe_names(parallel, data):
    recipe = QuantRecipe.from_dict(data)
    layer = _layer(recipe)
    x, grad = _data()
    y, dx, dw = _run(layer, x, grad)
    y_ref, dx_ref, dw_ref = _reference(recipe, x, layer.weight.detach(), grad)
    for ours, ref, name in ((y, y_ref, "y"), (dx, dx_ref, "dx"), (dw, dw_ref, "dw")):
        torch.testing.assert_close(ours, ref, rtol=0, atol=0, msg=name)
    plain = x.reshape(-1, IN).t() @ grad.reshape(-1, OUT)
    # high precision: dW from the original tensors; dequantized: from the forward's values, which differ
    assert torch.equal(dw, plain.t()) == (recipe.backward_override == "high_precision")


def test_a_dequantized_source_refuses_a_hadamard_forward_operand():
    hadamard = get_format("nvfp4", hadamard=16)
    formats = {key: None for key in ("fprop.input", "fprop.weight", "dgrad.grad_output", "dgrad.weight",
                                     "wgrad.grad_output", "wgrad.input")}
    with pytest.raises(ValueError, match="wgrad.input is taken from fprop.input's dequantized operand, which nvfp4 "
                                         "leaves Hadamard-transformed"):
        LinearQuant.from_formats({**formats, "fprop.input": hadamard}, frozenset({"wgrad.input"}))
