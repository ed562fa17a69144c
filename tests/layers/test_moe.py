"""MoE layers built by megatron-core with our backend: every routed expert quantizes its GEMMs with its
own per-tensor scales (checked against an FP8 oracle written out with torch's float8 cast), shared
experts too; an expert with no tokens runs (current scaling: no division by zero; delayed scaling: its
history skips the zero amax, as TE's kernel does); the router stays high precision unless a rule names
it; sites name experts globally; precision files match ``*.experts.*``."""
import pytest
import torch

from megatron.quant import position
from megatron.quant.layers.linear import QuantLinearMixin
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.precision_file import precision_from_dict
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import moe_config, moe_layer

HIDDEN = 128
E4M3_MAX = 448.0


def _e4m3_current(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor current scaling to FP8 E4M3 and back (TE's Float8CurrentScaling), from x's own amax."""
    scale = E4M3_MAX / x.abs().amax().float()
    return (x.float() * scale).to(torch.float8_e4m3fn).float() / scale


def _experts_run(layer, tokens_per_expert: list[int], seed: int = 0, big_expert: int | None = None):
    """Run the layer's routed experts on dispatched tokens (``tokens_per_expert`` of them per expert);
    returns (the hidden states, each expert's fc1 input and output as the layer saw them)."""
    g = torch.Generator().manual_seed(seed)
    pieces = [torch.randn(n, HIDDEN, generator=g) for n in tokens_per_expert]
    if big_expert is not None:
        pieces[big_expert] = pieces[big_expert] * 1e5  # a stacked amax would crush every other expert
    hidden = torch.cat(pieces).requires_grad_()
    seen = {}
    hooks = [expert.linear_fc1.register_forward_hook(
        lambda m, args, out, e=e: seen.__setitem__(e, (args[0].detach(), out[0].detach())))
        for e, expert in enumerate(layer.mlp.experts.local_experts)]
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    out, _ = layer.mlp.experts(hidden, torch.tensor(tokens_per_expert), torch.ones(hidden.shape[0]))
    out.float().sum().backward()
    for hook in hooks:
        hook.remove()
    return hidden, seen


def test_each_expert_quantizes_with_its_own_amax_and_an_empty_expert_runs(parallel):
    layer = moe_layer(moe_config(hidden_size=HIDDEN, quant_recipe=precision_config(QuantRecipe.uniform("fp8_e4m3"))))
    hidden, seen = _experts_run(layer, [6, 0, 6, 4], big_expert=2)
    for e, (x, y) in seen.items():
        if x.shape[0] == 0:
            continue
        weight = layer.mlp.experts.local_experts[e].linear_fc1.weight.detach()
        own = _e4m3_current(x) @ _e4m3_current(weight).t()
        assert torch.allclose(y, own, rtol=1e-5, atol=1e-5 * own.abs().max().item()), e
    x0, y0 = seen[0]
    stacked = _e4m3_current(torch.cat([x0, seen[2][0].abs().amax().expand(1, HIDDEN)]))[:-1]
    assert not torch.allclose(stacked @ _e4m3_current(layer.mlp.experts.local_experts[0].linear_fc1.weight).t(), y0,
                              rtol=1e-3, atol=1e-3)  # what one amax for the stacked experts would have given
    assert seen[1][0].shape == (0, HIDDEN) and seen[1][1].shape[0] == 0
    empty = layer.mlp.experts.local_experts[1]
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in empty.parameters())
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    quantized = [m for m in layer.modules() if isinstance(m, QuantLinearMixin)]
    assert len(quantized) == 2 + 2 * 4 + 2 and all(m.quant["fprop.input"].fmt is not None for m in quantized)


def test_delayed_scaling_skips_an_empty_experts_zero_amax(parallel):
    layer = moe_layer(moe_config(hidden_size=HIDDEN,
                                 quant_recipe=precision_config(QuantRecipe.from_dict({"format": "te-fp8-delayed"}))))
    fc1 = layer.mlp.experts.local_experts[1].linear_fc1
    _experts_run(layer, [4, 5, 4, 3], seed=1)
    history = {key: (h.amax_history.clone(), h.amax_for_scale.clone()) for key, h in fc1.amax_histories.items()}
    assert history["fprop_input"][1].item() > 0
    _, seen = _experts_run(layer, [8, 0, 5, 3], seed=2)
    for key in ("fprop_input", "dgrad_grad_output"):
        assert torch.equal(fc1.amax_histories[key].amax_history, history[key][0])
        assert torch.equal(fc1.amax_histories[key].amax_for_scale, history[key][1])
    assert seen[1][1].shape[0] == 0 and torch.isfinite(seen[0][1]).all()


def test_router_is_high_precision_unless_a_rule_names_it(parallel):
    torch.manual_seed(0)
    x = torch.randn(16, 2, HIDDEN)
    plain = moe_layer(moe_config(hidden_size=HIDDEN, quant_recipe=precision_config(QuantRecipe.uniform("mxfp8"))))
    assert all(spec.fmt is None for spec in plain.mlp.router.quant.specs.values())
    logits = plain.mlp.router.gating(x)
    assert logits.dtype == torch.float32 and torch.equal(logits, x @ plain.mlp.router.weight.t())
    named = QuantRecipe.from_dict({"format": "mxfp8", "rules": [{"match": {"roles": ["router"]}, "format": "mxfp8"}]})
    router = moe_layer(moe_config(hidden_size=HIDDEN, quant_recipe=precision_config(named))).mlp.router
    fmt = router.quant["fprop.input"].fmt
    assert fmt is not None and router.capture_site.module == "decoder.layers.0.mlp.router"
    expected = fmt.quantize(x, axis=-1) @ fmt.quantize(router.weight.detach(), axis=1).t()
    assert torch.equal(router.gating(x).detach(), expected)
    with pytest.raises(ValueError, match="quantized router: moe_router_dtype 'fp64'"):
        moe_layer(moe_config(hidden_size=HIDDEN, moe_router_dtype="fp64", quant_recipe=precision_config(named)))


def test_sites_name_experts_globally_and_precision_files_match_them(parallel):
    precision = precision_from_dict({
        "configs": {"experts": "mxfp8", "rest": "bf16"},
        "matchers": {"e": {"type": "glob", "pattern": "*.experts.*", "config": "experts", "enabled": True},
                     "d": {"type": "glob", "pattern": "*", "config": "rest", "enabled": True}}}, "moe", "<test>")
    layer = moe_layer(moe_config(hidden_size=HIDDEN, quant_recipe=precision), layer_idx=3)
    sites = {m.capture_site.module: m.quant["fprop.input"].fmt is not None
             for m in layer.modules() if isinstance(m, QuantLinearMixin)}
    assert sites == {**{f"decoder.layers.3.mlp.experts.{e}.linear_fc{i}": True for e in range(4) for i in (1, 2)},
                     "decoder.layers.3.mlp.shared_experts.linear_fc1": False,
                     "decoder.layers.3.mlp.shared_experts.linear_fc2": False,
                     "decoder.layers.3.self_attention.linear_qkv": False,
                     "decoder.layers.3.self_attention.linear_proj": False}
