"""Grouped experts on the test device: torch's grouped GEMM (where it runs there) gives each expert's exact
product for the layouts the experts use, with token counts of any size and an expert without tokens; an
MoE layer's grouped experts against the same experts run one after another (the CPU suite holds the bits:
tests/layers/test_grouped_experts.py; on a GPU the two GEMM kernels may add the products in other orders)."""
import pytest
import torch
from megatron.core.transformer.moe.experts import SequentialMLP

from megatron.quant import position
from megatron.quant.layers.grouped_experts import QuantGroupedMLP
from megatron.quant.layers.grouped_gemm import grouped_product
from megatron.quant.layers.grouped_operand import TokenGroups
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import moe_config, moe_layer

pytestmark = pytest.mark.device

COUNTS = (5, 0, 19, 8)


def test_grouped_products_are_each_experts_exact_product(device):
    g = torch.Generator().manual_seed(0)
    ints = lambda *shape: torch.randint(-2, 3, shape, generator=g)  # noqa: E731  small sums: exact in bf16
    x, dy, w = ints(sum(COUNTS), 64), ints(sum(COUNTS), 32), ints(len(COUNTS), 32, 64)
    on = lambda t: t.to(device, torch.bfloat16)  # noqa: E731
    groups = TokenGroups(COUNTS, device)
    split = lambda t: t.split(list(COUNTS))  # noqa: E731
    expected = {"fprop": torch.cat([a @ b.t() for a, b in zip(split(x), w)]),
                "dgrad": torch.cat([a @ b for a, b in zip(split(dy), w)]),
                "wgrad": torch.stack([a.t() @ b for a, b in zip(split(dy), split(x))])}
    got = {"fprop": grouped_product("fprop", on(x), on(w), groups),
           "dgrad": grouped_product("dgrad", on(dy), on(w), groups),
           "wgrad": grouped_product("wgrad", on(dy), on(x), groups)}
    for gemm, product in got.items():
        assert product.dtype == torch.bfloat16 and torch.equal(product.cpu().to(torch.int64), expected[gemm]), gemm


@pytest.mark.parametrize("preset", [None, "te-mxfp8"])
def test_grouped_experts_on_device(parallel, device, preset):
    quant = None if preset is None else precision_config(QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset}))
    experts = moe_layer(moe_config(hidden_size=128, params_dtype=torch.bfloat16, bf16=True,
                                   quant_recipe=quant)).mlp.experts.to(device)
    assert experts.grouped_reason() is None
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(COUNTS), 128, generator=g).to(device, torch.bfloat16)
    probs, dy = torch.rand(sum(COUNTS), generator=g).to(device), torch.randn(sum(COUNTS), 128, generator=g)
    results = []
    for forward in (QuantGroupedMLP.forward, SequentialMLP.forward):
        position.set_iteration(0)
        position.set_microbatch(0, 0)
        leaf = x.clone().requires_grad_()
        out, _ = forward(experts, leaf, torch.tensor(COUNTS), probs)
        out.backward(dy.to(device, torch.bfloat16))
        results.append([out.detach(), leaf.grad] + [p.grad.clone() for p in experts.parameters()])
        experts.zero_grad(set_to_none=True)
    for grouped, sequential in zip(*results):
        if device.type == "cpu":
            assert torch.equal(grouped, sequential)
        else:  # GEMM kernels of their own: the same sums in other orders, rounded to bf16
            torch.testing.assert_close(grouped.float(), sequential.float(), rtol=0.05, atol=0.05)
