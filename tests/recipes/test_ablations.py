"""Recipe variants (``recipes.ablations``): each differs from its base in exactly the component its
name removes or adds, compared on the formats every operand of every layer resolves to; the names
are accepted wherever a preset name is."""
import pytest

from megatron.quant import formats
from megatron.quant.compare.whatif import parse_candidates
from megatron.quant.lab.sweep_plan import SweepError, resolve_recipe
from megatron.quant.recipes import ablations
from megatron.quant.recipes.cli import main as recipes_main
from megatron.quant.recipes.operands import DECODER_LINEAR_ROLES, LINEAR_OPERANDS, ROLES
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

NUM_LAYERS = 4
GRADIENTS = {"dgrad.grad_output", "wgrad.grad_output"}
WGRAD = {"wgrad.grad_output", "wgrad.input"}
WEIGHTS = {"fprop.weight", "dgrad.weight"}
LINEAR = DECODER_LINEAR_ROLES


def _resolved(name: str) -> dict:
    """(role, layer, operand) -> (format name, its full options as built), for every module."""
    recipe = QuantRecipe.from_dict({"format": name})
    out = {}
    for role in ROLES:
        for layer in range(NUM_LAYERS):
            for key, choice in recipe.choices(role, layer, NUM_LAYERS).items():
                built = None if formats.is_passthrough(choice.name) else \
                    formats.get_format(choice.name, **dict(choice.options)).options
                out[role, layer, key] = (choice.name, built)
    return out


def _differences(base: str, variant: str) -> dict:
    """(role, layer, operand) -> the option names (or "format") in which the variant differs."""
    a, b = _resolved(base), _resolved(variant)
    diff = {}
    for site in a:
        (fa, oa), (fb, ob) = a[site], b[site]
        if fa != fb:
            diff[site] = {"format"}
        elif oa != ob:
            diff[site] = {k for k in set(oa) | set(ob) if oa.get(k) != ob.get(k)}
    return diff


def _every(keys, options, layers=range(NUM_LAYERS)) -> dict:
    return {(role, layer, key): set(options) for role in LINEAR for layer in layers for key in keys}


HADAMARD = {"hadamard", "hadamard_signs"}
CASES = [  # (base, variant, expected differences)
    ("te-nvfp4", "te-nvfp4-no-sr", _every(GRADIENTS, {"rounding"})),
    ("te-nvfp4", "te-nvfp4-no-rht", _every(WGRAD, HADAMARD)),
    ("te-nvfp4", "te-nvfp4-no-2d", _every(WEIGHTS, {"block_shape"})),
    ("te-nvfp4", "te-nvfp4+bf16-layers", _every(LINEAR_OPERANDS, {"format"}, (0, NUM_LAYERS - 1))),
    ("te-nvfp4+bf16-layers", "te-nvfp4+bf16-layers-no-sr", _every(GRADIENTS, {"rounding"}, (1, 2))),
    ("te-mxfp8", "te-mxfp8-no-rceil", _every(LINEAR_OPERANDS, {"scale_mode"})),
    ("mxfp4", "mxfp4+sr", _every(GRADIENTS, {"rounding"})),
    ("mxfp4", "mxfp4+rht", _every(WGRAD, HADAMARD)),
    ("mxfp4", "mxfp4+sr+rht", {**_every(GRADIENTS - WGRAD, {"rounding"}), **_every(WGRAD - GRADIENTS, HADAMARD),
                               **_every(GRADIENTS & WGRAD, HADAMARD | {"rounding"})}),
]


@pytest.mark.parametrize("base, variant, expected", CASES, ids=[case[1] for case in CASES])
def test_each_variant_differs_from_its_base_in_exactly_its_component(base, variant, expected):
    assert _differences(base, variant) == expected


def test_the_nvfp4_report_ablation_without_bf16_layers_is_te_nvfp4_itself():
    assert _resolved("te-nvfp4+bf16-layers-no-bf16-layers") == _resolved("te-nvfp4")
    assert _resolved("mxfp4+sr+rht") == _resolved("mxfp4+rht+sr")


def test_ablate_expands_a_base_into_itself_and_one_variant_per_component():
    assert ablations.ablation("te-nvfp4") == ["te-nvfp4", "te-nvfp4-no-sr", "te-nvfp4-no-rht", "te-nvfp4-no-2d",
                                              "te-nvfp4+bf16-layers", "te-nvfp4+bf16-fwd-tail"]
    assert ablations.ablation("te-nvfp4+bf16-layers")[1:] == [
        "te-nvfp4+bf16-layers-no-sr", "te-nvfp4+bf16-layers-no-rht", "te-nvfp4+bf16-layers-no-2d",
        "te-nvfp4+bf16-layers-no-bf16-layers", "te-nvfp4+bf16-layers+bf16-fwd-tail"]
    assert ablations.ablation("te-mxfp8") == ["te-mxfp8", "te-mxfp8-no-rceil"]
    assert ablations.ablation("mxfp4") == ["mxfp4", "mxfp4+sr", "mxfp4+rht", "mxfp4+sr+rht"]
    with pytest.raises(ablations.AblationError, match="'nvfp5': not a preset, variant or format name"):
        ablations.ablation("nvfp5")


@pytest.mark.parametrize("name, message", [
    ("te-nvfp4-no-bf16-layers", "te-nvfp4 has no 'bf16-layers'.*add it with te-nvfp4\\+bf16-layers"),
    ("te-mxfp8-no-sr", "te-mxfp8 has no 'sr'"),
    ("mxfp4+sr+sr", "mxfp4\\+sr has 'sr'.*already"),
    ("mxfp4+rceil", "'rceil'.*can only be removed"),
    ("te-nvfp4+2d", "te-nvfp4 has '2d'.*already"),
    ("te-nvfp4-no-fast", "unknown component 'fast'; components: sr, rht, 2d, rceil, bf16-layers, bf16-fwd-tail, "
                         "4over6, row-scaled, hopper-acc, bwd-hp, bwd-dq"),
])
def test_impossible_variants_name_the_component(name, message):
    with pytest.raises(RecipeError, match=message):
        QuantRecipe.from_dict({"format": name})
    with pytest.raises(SweepError, match=message):
        resolve_recipe(name)


def test_variant_names_are_accepted_wherever_a_preset_name_is(capsys):
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "te-nvfp4-no-sr"})
    assert recipe.name == "te-nvfp4-no-sr" and recipe.scope == frozenset({"linear"})
    assert resolve_recipe("mxfp4+sr+rht") == ("mxfp4+sr+rht", {"CUSTOM_QUANT_TYPE": "mxfp4+sr+rht"})
    assert [c.name for c in parse_candidates(["te-nvfp4-no-2d", "mxfp4+sr"])] == ["te-nvfp4-no-2d", "mxfp4+sr"]
    assert recipes_main(["show", "te-nvfp4", "--ablate", "--num-layers", "2"]) == 0
    out = capsys.readouterr().out
    for name in ablations.ablation("te-nvfp4"):
        assert f"recipe {name} (" in out
    assert "te-nvfp4 without stochastic rounding" in out
    assert recipes_main(["show"]) == 0
    assert "mxfp4+sr, mxfp4+rht, mxfp4+sr+rht" in capsys.readouterr().out
