"""One selector grammar for the recipe's match.layers and the capture filters (TENSOR_SAVE_LAYERS)."""
import pytest

from megatron.quant.capture.config import SaverConfig
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

NUM_LAYERS = 6


def _bf16_layers(layers) -> list[int]:
    recipe = QuantRecipe.from_dict({"format": "fp8_e4m3", "rules": [{"match": {"layers": layers}, "format": "bf16"}]})
    return [i for i in range(NUM_LAYERS) if recipe.resolve("fc1", i, NUM_LAYERS)["fprop.input"] is None]


@pytest.mark.parametrize("layers,expected", [
    ("0,2-3", [0, 2, 3]), (["0,-1"], [0, 5]), (["1", "3:5,-2"], [1, 3, 4]), ("4:", [4, 5]), (-1, [5])])
def test_recipe_takes_comma_lists_beside_its_own_grammar(layers, expected):
    assert _bf16_layers(layers) == expected


def test_the_capture_grammar_selects_the_same_layers_in_both():
    for text in ("0,2-3", "1", "0-5"):
        assert _bf16_layers(text) == sorted(SaverConfig(layers=text).layers)


@pytest.mark.parametrize("bad", ["1,,2", "3-1", "x", "1-", True, 0.5])
def test_both_refuse_the_same_bad_items(bad):
    with pytest.raises(RecipeError, match=r"rules\[0\]\.match\.layers\[0\]: invalid layer selector"):
        _bf16_layers([bad])
    if isinstance(bad, str):
        with pytest.raises(ValueError, match=r"SaverConfig\.layers=.* is invalid; allowed: non-negative"):
            SaverConfig(layers=bad)


def test_capture_filters_refuse_the_recipe_only_forms():
    for text in ("-1", "2:4"):
        with pytest.raises(ValueError, match=rf"TENSOR_SAVE_LAYERS='{text}' is invalid"):
            SaverConfig.from_env({"TENSOR_SAVE_LAYERS": text})
