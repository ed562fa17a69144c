"""Capture stays inside TENSOR_SAVE_DIR: recipe names and capture tokens cannot leave it."""
import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.capture.naming import file_name
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from megatron.quant.tensor_saver import CaptureSite


@pytest.mark.parametrize("name", ["..", ".", ".hidden"])
def test_recipe_refuses_names_that_leave_or_hide_the_directory(name):
    with pytest.raises(RecipeError, match=rf"name: {name!r} .*not starting with '\.'"):
        QuantRecipe.from_dict({"name": name, "format": "bf16"})


@pytest.mark.parametrize("line", ['name: ""', "name:"])
def test_empty_recipe_name_in_a_file_is_the_file_stem(tmp_path, line):
    path = tmp_path / "my-recipe.yaml"
    path.write_text(f"{line}\nformat: bf16\n")
    assert QuantRecipe.from_file(path).name == "my-recipe"


@pytest.mark.parametrize("quant_type", ["..", ".", ".x", "a/b"])
def test_capture_refuses_a_quant_type_outside_the_directory(tmp_path, quant_type, capture_session):
    save_dir = tmp_path / "captures"
    capture_session(save_dir, iterations="0")
    position.set_iteration(0)
    site = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", quant_type)
    with pytest.raises(ValueError, match=r"quant_type=.* is invalid; allowed: .*not starting with '\.'"):
        tensor_saver.capture(site, "forward", "pre", {"input": torch.ones(2)})
    tensor_saver.flush()
    assert {p.name for p in tmp_path.iterdir()} <= {"captures"}  # nothing beside the capture directory


def test_file_name_refuses_a_token_with_a_separator():
    metadata = {"saved_at": "2025-01-01T00:00:00", "iteration": 0, "layer_type": "linear", "layer_idx": 0,
                "operation": "forward", "phase": "pre", "component": "linear", "quant_type": "bf16", "rank": 0,
                "sample": 0, "tensor_name": "../../input"}
    with pytest.raises(ValueError, match="capture file name .* is invalid"):
        file_name(metadata, 0)
