"""QuantRecipe: env vars, files, Python construction, resolution rules, and refusals."""
import json

import pytest

from megatron.quant import formats
from megatron.quant.layers.module_quant import format_builder
from megatron.quant.recipes.operands import ATTENTION_OPERANDS, LINEAR_OPERANDS, PV_OPERANDS, QK_OPERANDS
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from tests.layers._helpers import BLOCK_FORMAT, TENSOR_FORMAT

NUM_LAYERS = 4


def _names(resolved):
    return {k: None if f is None else f.name for k, f in resolved.items()}


def test_default_is_bf16_passthrough():
    recipe = QuantRecipe.from_env({})
    assert recipe.name == "bf16"
    assert all(f is None for f in recipe.resolve("fc1", 0, NUM_LAYERS).values())


@pytest.mark.parametrize("value", ["bf16", "fp16", "none"])
def test_passthrough_types(value):
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": value})
    assert recipe.name == value
    for role in ("qkv", "core_attention"):
        assert all(f is None for f in recipe.resolve(role, 1, NUM_LAYERS).values())


def test_uniform_type_covers_linear_and_attention_not_the_lm_head():
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": BLOCK_FORMAT.upper()})
    expected = formats.get_format(BLOCK_FORMAT).name
    assert recipe.name == BLOCK_FORMAT
    assert set(_names(recipe.resolve("proj", 2, NUM_LAYERS)).values()) == {expected}
    assert set(_names(recipe.resolve("core_attention", 2, NUM_LAYERS)).values()) == {expected}
    assert set(recipe.resolve("output_layer", -1, NUM_LAYERS).values()) == {None}
    assert QuantRecipe.uniform(BLOCK_FORMAT) == recipe


@pytest.mark.parametrize("scope,quantized", [("linear", LINEAR_OPERANDS), ("attention.qk", QK_OPERANDS),
                                             ("attention.pv", PV_OPERANDS), ("attention", ATTENTION_OPERANDS),
                                             ("linear, attention.pv", LINEAR_OPERANDS + PV_OPERANDS)])
def test_scope_selects_operands(scope, quantized):
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": TENSOR_FORMAT, "CUSTOM_QUANT_SCOPE": scope})
    resolved = {**recipe.resolve("fc2", 0, NUM_LAYERS), **recipe.resolve("core_attention", 0, NUM_LAYERS)}
    assert {k for k, f in resolved.items() if f is not None} == set(quantized)


def test_unknown_type_lists_valid_values():
    with pytest.raises(ValueError) as info:
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": "fp7"})
    message = str(info.value)
    assert "'fp7'" in message and "bf16" in message and formats.get_format(BLOCK_FORMAT).name in message


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match=r"attention\.qv.*allowed.*attention\.qk"):
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": BLOCK_FORMAT, "CUSTOM_QUANT_SCOPE": "linear,attention.qv"})


YAML_RECIPE = f"""
name: edges-bf16
format: {BLOCK_FORMAT}
operands:
  wgrad.grad_output: {{options: {{rounding: stochastic, seed: 7}}}}
rules:
  - match: {{layers: [0, -1]}}
    format: bf16
  - match: {{roles: [fc2], layers: ["1-2"]}}
    operands:
      fprop.input: {TENSOR_FORMAT}
  - match: {{roles: [output_layer]}}
    format: {TENSOR_FORMAT}
"""


def test_yaml_recipe_rules(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(YAML_RECIPE)
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_RECIPE": str(path)})
    block, tensor = formats.get_format(BLOCK_FORMAT).name, formats.get_format(TENSOR_FORMAT).name
    assert recipe.name == "edges-bf16"
    for layer in (0, NUM_LAYERS - 1):
        assert set(recipe.resolve("qkv", layer, NUM_LAYERS).values()) == {None}
    middle = recipe.resolve("fc2", 1, NUM_LAYERS)
    assert middle["fprop.input"].name == tensor and middle["fprop.weight"].name == block
    assert middle["wgrad.grad_output"].options["rounding"] == "stochastic"
    assert recipe.resolve("fc1", 2, NUM_LAYERS)["fprop.input"].name == block
    assert _names(recipe.resolve("output_layer", -1, NUM_LAYERS)) == dict.fromkeys(LINEAR_OPERANDS, tensor)


def test_json_recipe_named_after_file_and_env_fills_defaults(tmp_path):
    path = tmp_path / "qk_only.json"
    path.write_text(json.dumps({"rules": [{"match": {"roles": ["core_attention"]},
                                           "operands": {"pv.probs": {"format": "bf16"}}}]}))
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_RECIPE": str(path), "CUSTOM_QUANT_TYPE": TENSOR_FORMAT,
                                   "CUSTOM_QUANT_SCOPE": "attention"})
    assert recipe.name == "qk_only"
    resolved = recipe.resolve("core_attention", 0, NUM_LAYERS)
    assert resolved["pv.probs"] is None and resolved["qk.query"].name == formats.get_format(TENSOR_FORMAT).name
    assert set(recipe.resolve("qkv", 0, NUM_LAYERS).values()) == {None}


@pytest.mark.parametrize("data,fragments", [
    ({"format": BLOCK_FORMAT, "rule": []}, ["rule", "allowed", "rules"]),
    ({"format": BLOCK_FORMAT, "operands": {"fprop.inputs": "bf16"}}, ["operands.fprop.inputs", "fprop.input"]),
    ({"rules": [{"match": {"layer": [0]}, "format": "bf16"}]}, ["rules[0].match.layer", "roles, layers"]),
    ({"rules": [{"match": {"roles": ["mlp"]}, "format": "bf16"}]}, ["rules[0].match.roles", "'mlp'", "fc1"]),
    ({"rules": [{"match": {"layers": ["first"]}, "format": "bf16"}]}, ["rules[0].match.layers[0]", "'first'"]),
    ({"rules": [{"match": {"layers": [0, "3-1"]}, "format": "bf16"}]}, ["rules[0].match.layers[1]", "'3-1'"]),
    ({"rules": [{"match": {"layers": [0]}}]}, ["rules[0]", "needs"]),
    ({"format": BLOCK_FORMAT, "options": {"rounding": "sideways"}}, ["format", "'sideways'"]),
    ({"format": "bf16", "options": {"rounding": "stochastic"}}, ["passthrough", "bf16"]),
    ({"scope": "everything"}, ["scope", "'everything'", "attention.qk"]),
])
def test_bad_recipe_names_file_key_and_value(tmp_path, data, fragments):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecipeError) as info:
        QuantRecipe.from_file(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_unreadable_or_unknown_recipe_files(tmp_path):
    with pytest.raises(RecipeError, match="cannot read"):
        QuantRecipe.from_env({"CUSTOM_QUANT_RECIPE": str(tmp_path / "missing.yaml")})
    (tmp_path / "r.toml").write_text("")
    with pytest.raises(RecipeError, match=r"\.toml"):
        QuantRecipe.from_file(tmp_path / "r.toml")
    (tmp_path / "r.yaml").write_text("format: [unclosed")
    with pytest.raises(RecipeError, match="not valid yaml"):
        QuantRecipe.from_file(tmp_path / "r.yaml")


@pytest.mark.parametrize("selector,selected", [
    (0, [0]), (-1, [3]), ("-2", [2]), (-5, []), (7, []), ("1-2", [1, 2]), ("1:3", [1, 2]), ("-2:", [2, 3]),
    (":1", [0])])
def test_layer_selectors(selector, selected):
    recipe = QuantRecipe.from_dict({"format": TENSOR_FORMAT, "rules": [{"match": {"layers": [selector]},
                                                                        "format": "bf16"}]})
    passthrough = [i for i in range(NUM_LAYERS) if recipe.resolve("qkv", i, NUM_LAYERS)["fprop.input"] is None]
    assert passthrough == selected


def test_python_construction_is_frozen_and_resolves_once_per_call():
    recipe = QuantRecipe.from_dict({"format": BLOCK_FORMAT, "scope": ["linear"]})
    assert recipe.name == f"{BLOCK_FORMAT}-linear"
    with pytest.raises(AttributeError):
        recipe.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown module role"):
        recipe.resolve("mlp", 0, NUM_LAYERS)


def test_guide_recipe_examples_load(tmp_path):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "recipes.md").read_text()
    from megatron.quant.recipes.precision_file import load_precision_file

    blocks = [block.split("```", 1)[0] for block in text.split("```yaml\n")[1:]]
    examples = [block for block in blocks if "matchers:" not in block]
    assert len(examples) == 8 and len(blocks) == 10  # and two per-module precision files
    for i, example in enumerate(blocks):
        path = tmp_path / f"example{i}.yaml"
        path.write_text(example)
        if example in examples:
            assert QuantRecipe.from_file(path).resolve("fc1", 5, 16) is not None
        else:
            assert len(load_precision_file(path).configs) == 3


def test_compile_switch_and_shared_instances():
    recipe = QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": BLOCK_FORMAT, "CUSTOM_QUANT_COMPILE": "1"})
    assert recipe.compile
    shared, build = {}, format_builder(recipe)  # what the layers run the recipe's formats with
    first, second = recipe.resolve("qkv", 0, 2, shared, build), recipe.resolve("fc2", 1, 2, shared, build)
    assert first["fprop.input"] is second["wgrad.input"] and len(shared) == 1
    assert type(first["fprop.input"]).__name__ == "CompiledFormat"
    assert type(recipe.resolve("qkv", 0, 2)["fprop.input"]).__name__ == "MXFormat"  # a recipe itself is data
    stochastic = QuantRecipe.uniform(BLOCK_FORMAT, compile=True, rounding="stochastic", seed=3)
    assert type(stochastic.resolve("qkv", 0, 2, build=format_builder(stochastic))["fprop.input"]).__name__ != \
        "CompiledFormat"
    with pytest.raises(RecipeError, match="'maybe' is not a boolean"):
        QuantRecipe.from_env({"CUSTOM_QUANT_TYPE": BLOCK_FORMAT, "CUSTOM_QUANT_COMPILE": "maybe"})
