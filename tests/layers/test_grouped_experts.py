"""Grouped experts (``QuantGroupedMLP``) against today's per-expert path, megatron-core's ``SequentialMLP.forward``
over the same experts (our quantized linear layers, one GEMM and one quantization per expert): the same bits
for the outputs, the input, probability and weight gradients, in bf16 and under the MoE presets' block
formats, with an expert that gets no tokens and token counts that are no multiple of any block; the grouped
GEMM and quantization helpers against per-expert references; the settings that keep the per-expert path."""
import pytest
import torch
from megatron.core.transformer.moe.experts import SequentialMLP

from megatron.quant import position
from megatron.quant.layers.grouped_experts import QuantGroupedMLP
from megatron.quant.layers.grouped_gemm import grouped_product
from megatron.quant.layers.grouped_operand import TokenGroups, quantize_groups
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.operands import OperandSpec
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import moe_config, moe_layer

HIDDEN = 128
COUNTS = [37, 0, 70, 21]  # no multiple of 32 or 128, one expert without tokens


def _experts(preset: str | None, **overrides):
    quant = None if preset is None else precision_config(QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": preset}))
    config = moe_config(**{"hidden_size": HIDDEN, "params_dtype": torch.bfloat16, "bf16": True, "quant_recipe": quant,
                           **overrides})
    return moe_layer(config).mlp.experts


def _run(experts, forward, counts=COUNTS, seed: int = 0, iteration: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(sum(counts), HIDDEN, generator=g) * 3).bfloat16().requires_grad_()
    probs = torch.rand(sum(counts), generator=g).requires_grad_()
    dy = torch.randn(sum(counts), HIDDEN, generator=g).bfloat16()
    position.set_iteration(iteration)
    position.set_microbatch(0, 0)
    for p in experts.parameters():
        p.grad = None
    out, bias = forward(experts, x, torch.tensor(counts), probs)
    out.backward(dy)
    return {"output": out, "grad_input": x.grad, "grad_probs": probs.grad,
            **{name: p.grad.clone() for name, p in experts.named_parameters()}}


@pytest.mark.parametrize("preset", [None, "deepseek-v3-fp8", "te-mxfp8"])
def test_grouped_experts_give_the_per_expert_bits(parallel, preset):
    experts = _experts(preset)
    assert isinstance(experts, QuantGroupedMLP) and experts.grouped_reason() is None
    grouped = _run(experts, QuantGroupedMLP.forward)
    sequential = _run(experts, SequentialMLP.forward)
    assert grouped.keys() == sequential.keys()
    for key, value in sequential.items():
        assert torch.equal(grouped[key], value), (preset, key)
    assert torch.equal(grouped["local_experts.1.linear_fc1.weight"], torch.zeros(128, HIDDEN, dtype=torch.bfloat16))
    assert _run(experts, QuantGroupedMLP.forward, [0] * 4)["output"].shape == (0, HIDDEN)  # no tokens at all


def test_quantized_weights_follow_the_weights(parallel):
    experts = _experts("te-mxfp8")
    _run(experts, QuantGroupedMLP.forward)
    with torch.no_grad():
        experts.local_experts[2].linear_fc2.weight.mul_(2)  # bumps the version: quantized again
    assert torch.equal(_run(experts, QuantGroupedMLP.forward, seed=1)["output"],
                       _run(experts, SequentialMLP.forward, seed=1)["output"])
    experts.local_experts[0].linear_fc1.weight.data.mul_(2)  # no version bump: the training loop invalidates
    from megatron.quant.layers.linear import invalidate_quantized_weights

    invalidate_quantized_weights(experts)
    assert torch.equal(_run(experts, QuantGroupedMLP.forward, seed=2)["output"],
                       _run(experts, SequentialMLP.forward, seed=2)["output"])


def test_grouped_experts_take_the_phase_of_a_scheduled_recipe(parallel):
    recipe = QuantRecipe.from_dict({"format": "bf16", "scope": ["linear"],
                                    "schedule": [{"from": 2, "forward": "mxfp8"}]})
    experts = _experts(None, quant_recipe=precision_config(recipe).for_run(4, 1))
    outputs = []
    for iteration in (1, 2):  # bf16, then mxfp8 forward operands
        grouped, sequential = (_run(experts, forward, iteration=iteration) for forward in (QuantGroupedMLP.forward,
                                                                                          SequentialMLP.forward))
        assert experts.grouped_reason() is None and torch.equal(grouped["output"], sequential["output"]), iteration
        outputs.append(grouped["output"])
    assert not torch.equal(*outputs)


def test_settings_the_grouped_path_does_not_reproduce_run_per_expert(parallel):
    experts = _experts("te-fp8-current")  # one amax per expert: the per-expert path
    assert "per-expert amaxes" in experts.grouped_reason()
    assert torch.equal(_run(experts, QuantGroupedMLP.forward)["output"], _run(experts, SequentialMLP.forward)["output"])
    assert "per-expert amaxes" in _experts("te-nvfp4").grouped_reason()  # stochastic rounding, Hadamard
    assert _experts(None, add_bias_linear=True, moe_shared_expert_intermediate_size=None).grouped_reason() == \
        "add_bias_linear is set"


def test_a_capture_keeps_the_per_expert_path(parallel, monkeypatch):
    from megatron.quant import tensor_saver

    experts = _experts("te-mxfp8")
    monkeypatch.setattr(tensor_saver, "is_active", lambda: True)
    assert experts.grouped_reason() == "a capture is in progress"


def test_grouped_products_are_each_experts_product():
    g = torch.Generator().manual_seed(0)
    counts = [5, 0, 11]
    groups = TokenGroups(tuple(counts), torch.device("cpu"))
    x, dy = torch.randn(16, 8, generator=g).bfloat16(), torch.randn(16, 24, generator=g).bfloat16()
    w = torch.randn(3, 24, 8, generator=g).bfloat16()
    xs, dys = x.split(counts), dy.split(counts)
    for out_dtype in (None, torch.float32):
        wide = (lambda t: t.float()) if out_dtype else (lambda t: t)
        assert torch.equal(grouped_product("fprop", x, w, groups, out_dtype),
                           torch.cat([wide(a) @ wide(b).t() for a, b in zip(xs, w)]))
        assert torch.equal(grouped_product("dgrad", dy, w, groups, out_dtype),
                           torch.cat([wide(a) @ wide(b) for a, b in zip(dys, w)]))
        assert torch.equal(grouped_product("wgrad", dy, x, groups, out_dtype),
                           torch.stack([wide(a).t() @ wide(b) for a, b in zip(dys, xs)]))
    odd = torch.randn(16, 6, generator=g).bfloat16()  # rows of 12 bytes: the per-expert loop
    assert torch.equal(grouped_product("wgrad", dy, odd, groups), torch.stack([a.t() @ b for a, b in
                                                                               zip(dys, odd.split(counts))]))


def test_token_axis_blocks_stay_inside_each_expert():
    from megatron.quant import formats

    fmt = formats.get_format("mxfp8")
    counts = (40, 0, 7, 33)
    x = torch.randn(sum(counts), 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    x[:40] *= 1e4  # one shared block along the tokens would flush the next expert's values
    groups = TokenGroups(counts, torch.device("cpu"))
    for axis in (0, -1):
        spec = OperandSpec(fmt, axis)
        expected = torch.cat([fmt.quantize_for_gemm(part, axis=axis)[0] for part in x.split(list(counts))])
        assert torch.equal(quantize_groups(x, spec, groups), expected), axis
