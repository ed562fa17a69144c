"""Per-module precision files (megatron-core's RecipeConfig YAML): our recipes and TE's per-module recipes
as payloads, matched by megatron-core's own matchers; bad files refused in one line before any model."""
import logging
from pathlib import Path

import pytest
from megatron.core.quantization.quant_config import GlobMatcher
from megatron.core.quantization.utils import get_quant_config_or_none

from megatron.quant.recipes.parse import RecipeError
from megatron.quant.recipes.precision_file import load_precision_file

THREE_MATCHERS = """\
configs:
  attention: bf16
  mlp: te-nvfp4
  rest: {format: te-mxfp8, name: rest}
matchers:
  attn: {type: glob, pattern: "*self_attention*", config: attention, enabled: true}
  fc: {type: glob, pattern: "*linear_fc*", config: mlp, enabled: true}
  default: {type: glob, pattern: "*", config: rest, enabled: true}
"""

TE_FILE = """\
configs:
  high: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {}}
  mx: {transformer_engine_config_type: TEQuantizationParams,
       training_recipe: {fp8_quantization_recipe: mxfp8, fp8_format: e4m3}}
  fp4: {transformer_engine_config_type: TEQuantizationParams, training_recipe: {fp4_quantization_recipe: nvfp4}}
  current: {transformer_engine_config_type: TEQuantizationParams,
            training_recipe: {fp8_quantization_recipe: tensorwise, fp8_format: hybrid}}
  block: {transformer_engine_config_type: TEQuantizationParams,
          training_recipe: {fp8_quantization_recipe: blockwise, fp8_format: e4m3}}
matchers:
  first: {type: glob, pattern: "*layers.0.*", config: high, enabled: true}
  fc1: {type: glob, pattern: "*fc1", config: fp4, enabled: true}
  off: {type: glob, pattern: "*fc2", config: current}
  rest: {type: glob, pattern: "*", config: mx, enabled: true}
"""


def _file(tmp_path, text, name="precision.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_our_payloads_are_matched_by_megatron_cores_matchers(tmp_path, caplog):
    precision = load_precision_file(_file(tmp_path, THREE_MATCHERS))
    assert precision.name == "precision" and all(isinstance(m, GlobMatcher) for m in precision.matchers)
    picked = {path: precision.recipe(get_quant_config_or_none(path, precision)).name for path in (
        "decoder.layers.1.self_attention.linear_qkv", "decoder.layers.1.mlp.linear_fc2", "output_layer")}
    assert picked == {"decoder.layers.1.self_attention.linear_qkv": "bf16", "decoder.layers.1.mlp.linear_fc2":
                      "te-nvfp4", "output_layer": "rest"}


def test_te_per_module_recipes_become_the_labs_presets(tmp_path, caplog):
    precision = load_precision_file(_file(tmp_path, TE_FILE))
    assert {key: recipe.name for key, recipe in precision.configs.items()} == {
        "high": "bf16", "mx": "te-mxfp8", "fp4": "te-nvfp4", "current": "te-fp8-current",
        "block": "te-fp8-blockwise"}
    assert [m.pattern for m in precision.matchers] == ["*layers.0.*", "*fc1", "*"]  # "off" is not enabled
    with caplog.at_level(logging.INFO, logger="megatron.core.quantization.quant_config"):
        assert get_quant_config_or_none("decoder.layers.0.mlp.linear_fc2", precision).config_key == "high"
    assert "matched to quant config" in caplog.text  # megatron-core logs each match itself


TE = "{transformer_engine_config_type: TEQuantizationParams, training_recipe: %s}"
BAD = {
    "unknown config name": ("configs: {a: bf16}\nmatchers: {m: {type: glob, pattern: '*', config: b, enabled: true}}",
                            "matchers.m: unknown config 'b'; configs: a"),
    "matcher without config": ("configs: {a: bf16}\nmatchers: {m: {type: glob, pattern: '*', enabled: true}}",
                               "matchers.m names no config"),
    "matcher type": ("configs: {a: bf16}\nmatchers: {m: {type: regex, pattern: '*', config: a, enabled: true}}",
                     "Match type 'regex' not implemented"),
    "unknown format": ("configs: {a: fp7}\nmatchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}",
                       "configs.a"),
    "custom TE recipe": (f"configs: {{a: {TE % '{fp8_quantization_recipe: custom, custom_recipe_factory: x.y}'}}}\n"
                         "matchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}",
                         "configs.a: training_recipe: custom_recipe_factory"),
    "delayed TE recipe": (f"configs: {{a: {TE % '{fp8_quantization_recipe: delayed}'}}}\n"
                          "matchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}",
                          "configs.a: fp8_quantization_recipe delayed"),
    "kitchen recipe": ("configs: {a: {kitchen_config_type: QLinearParams, recipe_idx: 3}}\n"
                       "matchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}",
                       "configs.a: a Kitchen recipe"),
    "malformed YAML": ("configs: {a: bf16\nmatchers: [", "not a valid YAML precision file"),
    "no enabled matcher": ("configs: {a: bf16}\nmatchers: {m: {type: glob, pattern: '*', config: a}}",
                           "no enabled matcher"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_files_stop_in_one_line(tmp_path, case):
    text, expected = BAD[case]
    with pytest.raises(RecipeError) as error:
        load_precision_file(_file(tmp_path, text))
    message = str(error.value)
    assert expected in message and "\n" not in message and message.startswith(str(tmp_path))


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "examples" / "precision").glob("*.yaml")))
def test_the_example_files_load(path):
    precision = load_precision_file(path)
    assert precision.name == path.stem and len(precision.configs) == len(precision.matchers) == 3
