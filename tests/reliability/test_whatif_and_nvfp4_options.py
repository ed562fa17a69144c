"""Hand-fed what-if sources (``TENSOR_SAVE_WHATIF``) and NVFP4 option combinations: each bad one is
refused in one line before any work, naming it, with the echo of a huge value cut."""
import pytest

from megatron.quant import tensor_saver
from megatron.quant.capture.whatif import MAX_SOURCES
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from megatron.quant.tensor_saver import SaverConfig


@pytest.mark.parametrize("value, message", [
    ("mxfp8,nosuchformat", "'nosuchformat' is not a format, preset or TE recipe name"),
    ("mxfp8," + "y" * 3000, r"'yyyy.*\.\.\. is not a format"),
    (",".join(["mxfp8", "hifp8"] * 3000), r"at most 4096 are read"),
    (",".join(f"mxfp8-{i}" for i in range(MAX_SOURCES + 1)), f"{MAX_SOURCES + 1} names, at most {MAX_SOURCES}"),
    ("x" * 100_000, r"100000 characters, at most 4096"),
])
def test_whatif_refuses_bad_sources_in_one_short_line(monkeypatch, value, message):
    monkeypatch.setenv("TENSOR_SAVE_WHATIF", value)
    with pytest.raises(ValueError, match=message) as err:
        SaverConfig.from_env()
    text = str(err.value)
    assert "\n" not in text and len(text) < 600


def test_whatif_layer_rules_without_a_layer_count_are_refused_at_configure(tmp_path):
    config = SaverConfig(enabled=True, save_dir=str(tmp_path / "captures"), whatif="mxfp8,te-nvfp4+bf16-layers")
    with pytest.raises(ValueError, match="'te-nvfp4\\+bf16-layers' has layer rules: the model's layer count"):
        tensor_saver.configure(config)
    assert not (tmp_path / "captures").exists()
    tensor_saver.configure(config, num_layers=4)
    tensor_saver.close()


@pytest.mark.parametrize("options, message", [
    ({"four_over_six": "mae", "rounding": "stochastic8"}, "four_over_six takes neither a stochastic rounding"),
    ({"four_over_six": "mse", "rounding": "stochastic"}, "four_over_six takes neither a stochastic rounding"),
    ({"four_over_six": "mae", "e4m3_max": 300}, r"e4m3_max=300 is not one of \[448, 256\]"),
    ({"e4m3_max": 256}, "e4m3_max=256 needs four_over_six"),
    ({"row_scaled": True, "block_shape": [16, 16]}, "row_scaled needs blocks along an axis"),
])
def test_recipe_refuses_nvfp4_options_te_refuses(options, message):
    with pytest.raises(RecipeError, match=message) as err:
        QuantRecipe.from_dict({"format": "nvfp4", "options": options})
    assert "\n" not in str(err.value)
