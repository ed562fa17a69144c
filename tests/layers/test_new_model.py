"""docs/extending.md#a-new-model, followed: the guide's block, run as it stands, puts an MLP of three
projections in megatron-core's Llama layer spec and gives it an adapter; without the adapter the spec is
refused with the line the guide shows; with it the layer builds, each projection takes its formats by role,
and the MLP's forward equals the formats' reference (operands quantized, plain matmuls)."""
import re
from pathlib import Path

import pytest
import torch
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron.quant import formats, position
from megatron.quant.layers.adapters import UnknownModule
from megatron.quant.layers.backend import QuantSpecProvider, with_backend
from megatron.quant.layers.module_quant import finish_init
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import gemm, operand, transformer_config

GUIDE = (Path(__file__).parents[2] / "docs" / "extending.md").read_text()
SECTION = GUIDE[GUIDE.index("## A new model"):]
RECIPE = QuantRecipe.from_dict({"format": "mxfp8", "scope": ["linear"],
                                "rules": [{"match": {"roles": ["fc2"]}, "format": "fp8_e4m3"}]})


def _guide():
    namespace = {"__name__": "guide"}
    exec(re.search(r"```python\n(.*?)```", SECTION, re.S).group(1), namespace)
    return namespace


def test_the_new_model_guide_adapts_a_module_of_its_own(parallel):
    guide = _guide()
    with pytest.raises(UnknownModule) as refused:
        with_backend(guide["layer_spec"], QuantSpecProvider())
    assert str(refused.value) == re.search(r"```text\n(.*?)\n```", SECTION, re.S).group(1)
    config = transformer_config(quant_recipe=precision_config(RECIPE))  # Llama's: gated_linear_unit=True
    layer = TransformerLayer(config, guide["spec"].submodules, layer_number=1)
    finish_init(layer, config, prefix="decoder.layers.0.")
    mlp = layer.mlp
    assert [(m.capture_site.module, m.capture_site.role) for m in (mlp.linear_gate, mlp.linear_up, mlp.linear_down)] \
        == [("decoder.layers.0.mlp.linear_gate", "fc1"), ("decoder.layers.0.mlp.linear_up", "fc1"),
            ("decoder.layers.0.mlp.linear_down", "fc2")]
    # role fc1, but not megatron-core's fused [gate; up]: each projection's rows are one run across TP shards
    assert {m.quant["fprop.weight"].shard_groups for m in (mlp.linear_gate, mlp.linear_up)} == {1}
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    x = torch.randn(8, 2, config.hidden_size, generator=torch.Generator().manual_seed(3))
    output, bias = mlp(x)
    block, tensor = formats.get_format("mxfp8"), formats.get_format("fp8_e4m3")
    linear = lambda t, w, f: gemm(lambda a, c: torch.matmul(a, c.t()), operand(t, f, -1), operand(w, f, 1))  # noqa: E731
    hidden = torch.nn.functional.silu(linear(x, mlp.linear_gate.weight, block)) * linear(x, mlp.linear_up.weight, block)
    assert bias is None and torch.equal(output, linear(hidden, mlp.linear_down.weight, tensor))
