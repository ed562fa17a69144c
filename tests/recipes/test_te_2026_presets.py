"""Transformer Engine's 2026 recipe options as presets and recipe keys, the operands each preset resolves
to, and the refusals. TE at commit d0067d0 (2026-08): ``common/recipe/__init__.py`` (``MXFP8BlockScaling``
lines 337-389 with ``enable_2d_quantization`` and ``backward_override``; ``NVFP4BlockScaling`` lines
489-627 with ``nvfp4_4over6``, ``nvfp4_4over6_e4m3_use_256``, ``row_scaled_activation``);
``pytorch/quantization.py`` lines 1670-1750 (which slots get 4over6, the 256 bound and row scaling:
not the gradients, and row scaling for the forward's non-weight tensors only); ``common/cast/mxfp8/
quantize_mxfp8.cuh`` lines 265-271 and 421-433 (a 2D tile's amax, then E8M0 as in 1D);
``pytorch/custom_recipes/quantizer_factory_zoo.py`` lines 120-158 (``mxfp8_fwd_nvfp4_bwd_factory``)
and 161-193 (``nvfp4_1d_weight_factory``)."""
import pytest

from megatron.quant.recipes import ablations, cli, presets
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

NEW = ("te-nvfp4-4over6", "te-nvfp4-row-scaled", "te-nvfp4-1d-weight", "te-mxfp8-2d", "te-mxfp8-bwd-hp",
       "te-mxfp8-bwd-dq", "te-mxfp8-fwd-nvfp4-bwd")
GRADIENTS = ("dgrad.grad_output", "wgrad.grad_output")
BACKWARD = ("dgrad.grad_output", "dgrad.weight", "wgrad.grad_output", "wgrad.input")


def _operands(name: str) -> dict[str, tuple[str, dict]]:
    recipe = QuantRecipe.from_dict({"format": name})
    return {key: (choice.name, dict(choice.options)) for key, choice in recipe.choices("fc1", 0, 4).items()}


def test_listed_and_shown(capsys):
    listing = cli.list_presets()
    for name in NEW:
        assert name in presets.preset_names() and name in listing
        assert cli.main(["show", name]) == 0
        assert capsys.readouterr().out.startswith(f"recipe {name} (reproduces TE ")


def test_nvfp4_4over6_is_te_with_rht_off_and_4over6_on_inputs_and_weights():
    ops = _operands("te-nvfp4-4over6")
    for key, (name, options) in ops.items():
        assert name == "nvfp4" and "hadamard" not in options
        gradient = key in GRADIENTS
        assert options["four_over_six"] == ("off" if gradient else "mae")
        assert options["e4m3_max"] == (448 if gradient else 256)
        assert options.get("rounding", "nearest") == ("stochastic8" if gradient else "nearest")
    assert ops["fprop.weight"][1]["block_shape"] == ops["dgrad.weight"][1]["block_shape"] == (16, 16)


def test_nvfp4_row_scaled_scales_the_input_rows_only():
    ops = _operands("te-nvfp4-row-scaled")
    assert [key for key, (_, options) in ops.items() if options.get("row_scaled")] == ["fprop.input", "wgrad.input"]
    assert ops["wgrad.input"][1]["hadamard"] == 16  # the columnwise input keeps TE's RHT


def test_mxfp8_2d_tiles_the_weights_only():
    ops = _operands("te-mxfp8-2d")
    for key, (name, options) in ops.items():
        assert name == "mxfp8_e4m3" and options["scale_mode"] == "rceil"
        assert options.get("block_shape", (1, 32)) == ((32, 32) if key.endswith("weight") else (1, 32))


@pytest.mark.parametrize("name, sources", [("te-mxfp8-bwd-hp", set()),
                                           ("te-mxfp8-bwd-dq", {"dgrad.weight", "wgrad.input"})])
def test_backward_overrides_leave_the_backward_gemms_unquantized(name, sources):
    ops = _operands(name)
    assert {key for key, (fmt, _) in ops.items() if fmt == "none"} == set(BACKWARD)
    assert QuantRecipe.from_dict({"format": name}).dequantized_sources() == sources


def test_mxfp8_forward_nvfp4_backward_follows_the_zoo():
    ops = _operands("te-mxfp8-fwd-nvfp4-bwd")
    assert {key: fmt for key, (fmt, _) in ops.items()} == {
        "fprop.input": "mxfp8_e4m3", "fprop.weight": "mxfp8_e4m3", **{key: "nvfp4" for key in BACKWARD}}
    assert ops["dgrad.weight"][1] == {"nonfinite": "te"}  # plain 1D NVFP4, from the forward's dequantized weight
    assert ops["wgrad.input"][1]["hadamard"] == ops["wgrad.grad_output"][1]["hadamard"] == 16
    assert QuantRecipe.from_dict({"format": "te-mxfp8-fwd-nvfp4-bwd"}).dequantized_sources() == {"dgrad.weight"}
    assert QuantRecipe.from_dict({"format": "te-nvfp4-1d-weight"}).dequantized_sources() == {"dgrad.weight"}


def test_backward_override_next_to_any_preset():
    recipe = QuantRecipe.from_dict({"format": "te-nvfp4", "backward_override": "dequantized"})
    assert all(recipe.choices("qkv", 0, 2)[key].name == "none" for key in BACKWARD)
    assert recipe.choices("qkv", 0, 2)["fprop.weight"].name == "nvfp4"
    assert recipe.choices("core_attention", 0, 2)["dq.key"].name == "none"  # attention: as the scope says


@pytest.mark.parametrize("data, message", [
    ({"backward_override": "bf16"}, "backward_override: 'bf16' is not one of high_precision, dequantized"),
    ({"columnwise_source": {"grad_output": "rowwise_dequantized"}},
     "columnwise_source.grad_output: unknown key 'grad_output'; allowed: weight, input"),
    ({"columnwise_source": {"weight": "dequantized"}},
     "columnwise_source.weight: 'dequantized' is not one of original, rowwise_dequantized"),
    ({"columnwise_source": "weight"}, "columnwise_source: expected a mapping"),
])
def test_malformed_direction_keys_are_refused_in_one_line(data, message):
    with pytest.raises(RecipeError, match=message) as error:
        QuantRecipe.from_dict({"format": "mxfp8", **data})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("variant, preset", [
    ("te-mxfp8+2d", "te-mxfp8-2d"), ("te-mxfp8+bwd-hp", "te-mxfp8-bwd-hp"), ("te-mxfp8+bwd-dq", "te-mxfp8-bwd-dq"),
    ("te-nvfp4+row-scaled", "te-nvfp4-row-scaled"), ("te-nvfp4-4over6-no-4over6", "te-nvfp4-no-rht"),
    ("te-mxfp8-bwd-dq-no-bwd-dq", "te-mxfp8"), ("te-nvfp4-no-rht+4over6", "te-nvfp4-4over6-no-sr+sr"),
])
def test_variants_add_and_remove_the_new_components(variant, preset):
    ours, theirs = (QuantRecipe.from_dict({"format": name}) for name in (variant, preset))
    for role in ("fc1", "core_attention"):  # the built formats: options resolved to their values
        assert {k: f and (f.name, f.options) for k, f in ours.resolve(role, 0, 4).items()} == \
            {k: f and (f.name, f.options) for k, f in theirs.resolve(role, 0, 4).items()}, role
    assert ours.dequantized_sources() == theirs.dequantized_sources()


def test_each_new_preset_ablates_its_new_component():
    assert "te-nvfp4-4over6-no-4over6" in ablations.ablation("te-nvfp4-4over6")
    assert "te-nvfp4-row-scaled-no-row-scaled" in ablations.ablation("te-nvfp4-row-scaled")
    assert "te-mxfp8-2d-no-2d" in ablations.ablation("te-mxfp8-2d")
    assert "te-mxfp8-bwd-hp-no-bwd-hp" in ablations.ablation("te-mxfp8-bwd-hp")
