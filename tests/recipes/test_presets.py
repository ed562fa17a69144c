"""Recipe presets (te-nvfp4, ...): resolved operand formats, merging with a file, refusals, a layer step."""
import pytest
import torch

from megatron.quant.recipes import presets
from megatron.quant.recipes.operands import BACKWARD_LINEAR_OPERANDS, LINEAR_OPERANDS
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

NUM_LAYERS = 4
EMULATED = list(presets.PRESETS)


def _resolved(name, role="fc1", layer=1):
    return QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": name}).resolve(role, layer, NUM_LAYERS)


def test_te_nvfp4_operands():
    fmts = _resolved("te-nvfp4")
    assert {f.name for f in fmts.values()} == {"nvfp4"}
    assert [k for k, f in fmts.items() if f.options["block_shape"] == (16, 16)] == ["fprop.weight", "dgrad.weight"]
    assert [k for k, f in fmts.items() if f.options["hadamard"] == 16] == ["wgrad.grad_output", "wgrad.input"]
    assert fmts["wgrad.grad_output"].options["hadamard_signs"] == fmts["wgrad.input"].options["hadamard_signs"]
    assert [k for k, f in fmts.items() if f.rounding == "stochastic8"] == ["dgrad.grad_output", "wgrad.grad_output"]


def test_te_mxfp8_and_fp8_current_and_blockwise_operands():
    assert {(f.name, f.options["scale_mode"], f.options["block_shape"]) for f in _resolved("te-mxfp8").values()} == \
        {("mxfp8_e4m3", "rceil", (1, 32))}
    current = {k: (f.name, f.options["scaling"]) for k, f in _resolved("te-fp8-current").items()}
    assert current == {k: ("fp8_e5m2" if k in presets.GRADIENTS else "fp8_e4m3", "tensor") for k in LINEAR_OPERANDS}
    block = _resolved("te-fp8-blockwise")
    assert {(f.name, f.options["scaling"], f.options["power_of_two_scales"]) for f in block.values()} == \
        {("fp8_e4m3", "block", True)}
    assert {k: f.options["block_shape"] for k, f in block.items()} == \
        {k: (128, 128) if k in presets.WEIGHTS else (1, 128) for k in LINEAR_OPERANDS}


@pytest.mark.parametrize("name", EMULATED)
def test_presets_quantize_linear_layers_only_and_are_named_after_the_preset(name):
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": name.upper()})
    assert recipe.name == name
    assert set(recipe.resolve("core_attention", 0, NUM_LAYERS).values()) == {None}
    assert set(recipe.resolve("output_layer", NUM_LAYERS, NUM_LAYERS).values()) == {None}
    unquantized = set(BACKWARD_LINEAR_OPERANDS) if recipe.backward_override else set()  # TE's backward_override
    assert {key for key, fmt in recipe.resolve("qkv", 0, NUM_LAYERS).items() if fmt is None} == unquantized


def test_file_keys_override_the_preset_and_rules_are_appended(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("format: te-nvfp4\noperands:\n  wgrad.input: {options: {hadamard: null}}\n"
                    "rules:\n  - match: {layers: '0'}\n    format: bf16\n")
    recipe = QuantRecipe.from_file(path)
    assert recipe.name == "mine"
    fmts = recipe.resolve("fc2", 1, NUM_LAYERS)
    assert fmts["wgrad.input"].options.get("hadamard") is None          # the file's override won
    assert fmts["wgrad.grad_output"].options["hadamard"] == 16           # the preset's kept
    assert fmts["fprop.weight"].options["block_shape"] == (16, 16)
    assert set(recipe.resolve("fc2", 0, NUM_LAYERS).values()) == {None}  # the file's rule


def test_scope_next_to_a_preset_widens_it_and_the_name_says_so():
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-mxfp8", "CUSTOM_QUANT_SCOPE": "linear,attention"})
    assert recipe.name == "te-mxfp8-attention+linear"
    assert {f.name for f in recipe.resolve("core_attention", 0, NUM_LAYERS).values()} == {"mxfp8_e4m3"}


def test_delayed_preset_is_te_delayed_scaling_hybrid():
    fmts = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-fp8-delayed"}).resolve("fc1", 0, NUM_LAYERS)
    for key, fmt in fmts.items():
        assert fmt.name == ("fp8_e5m2" if "grad_output" in key else "fp8_e4m3")
        assert (fmt.scaling, fmt.options["amax_history_len"], fmt.options["amax_compute_algo"],
                fmt.options["margin"]) == ("delayed", 1024, "max", 0)


def test_unknown_format_lists_the_presets():
    with pytest.raises(RecipeError, match=r"'te-nvfp5'.*nvfp4.*te-nvfp4.*te-fp8-blockwise"):
        QuantRecipe.from_dict({"format": "te-nvfp5"})


def test_sweep_takes_preset_names():
    from megatron.quant.lab.sweep_plan import SweepError, plan_runs

    runs = plan_runs("bf16 te-nvfp4 te-fp8-delayed")
    assert [(r.name, dict(r.env)) for r in runs[1:]] == [("te-nvfp4", {"CUSTOM_QUANT_TYPE": "te-nvfp4"}),
                                                         ("te-fp8-delayed", {"CUSTOM_QUANT_TYPE": "te-fp8-delayed"})]
    with pytest.raises(SweepError, match="unknown recipe 'te-fp8-lazy'.*te-fp8-delayed"):
        plan_runs("bf16 te-fp8-lazy")


@pytest.mark.parametrize("name", EMULATED)
def test_a_linear_layer_steps_under_each_preset(parallel, name):
    from megatron.quant.layers.linear import QuantColumnParallelLinear
    from megatron.quant.layers.linear_function import LinearQuant
    from megatron.quant.tensor_saver import CaptureSite
    from tests.layers._helpers import transformer_config

    layer = QuantColumnParallelLinear(64, 128, config=transformer_config(), init_method=torch.nn.init.normal_,
                                      bias=False, gather_output=False)
    site = CaptureSite("linear", "linear", 0, "t", "fc1", "t")
    layer.configure_quant(LinearQuant.from_formats(_resolved(name)), site)
    x = torch.randn(16, 2, 64, requires_grad=True)
    y, _ = layer(x)
    y.backward(torch.randn_like(y))
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()
    assert not torch.equal(y, x @ layer.weight.t())  # quantized


def test_a_file_operand_override_merges_options_with_the_preset(tmp_path):
    path = tmp_path / "no_rht.yaml"
    path.write_text("format: te-nvfp4\noperands:\n  wgrad.grad_output: {options: {hadamard: null}}\n"
                    "  wgrad.input: {options: {hadamard: null}}\n")
    formats = QuantRecipe.from_file(path).resolve("fc1", 1, 4)
    grad = formats["wgrad.grad_output"]
    assert grad.options["hadamard"] is None and grad.rounding == "stochastic8"  # the preset's rounding stays
    assert formats["wgrad.input"].options["hadamard"] is None
