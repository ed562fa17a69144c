"""Per-module precision files fed by a careless or hostile user: every bad file ends in one line before any
model exists (a FIFO does not hang the start, a device file does not fill memory), and a matcher that
decides no module is named in a warning instead of training those modules silently in another precision."""
import os
import warnings

import pytest
import torch
from megatron.core.quantization.quant_config import GlobMatcher

from megatron.quant.layers.module_quant import FinishesInit, warn_idle_matchers
from megatron.quant.recipes.parse import RecipeError
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.precision_file import load_precision_file
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.training.arguments import ArgumentError
from megatron.quant.training.main import check_inputs
from megatron.quant.yaml_safe import MAX_FILE_BYTES
from tests.reliability._faults import deadline

GOOD = "configs: {a: mxfp8}\nmatchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}\n"
TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2", "--bf16"]


def _refused(path, *expected):
    with deadline(10), pytest.raises(RecipeError) as error:
        load_precision_file(path)
    message = str(error.value)
    assert "\n" not in message and len(message) < 1000, message
    for text in expected:
        assert text in message, (text, message)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "precision.yaml"
    os.mkfifo(fifo)
    _refused(fifo, str(fifo), "is a FIFO; give a regular file")


def test_a_device_file_is_refused_before_it_fills_memory():
    _refused("/dev/zero", "/dev/zero", "is a device")


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_missing_file_or_a_directory_is_refused(tmp_path, kind):
    path = tmp_path / "precision.yaml"
    if kind == "directory":
        path.mkdir()
    _refused(path, str(path), "No such file" if kind == "missing" else "is a directory")


def test_a_file_of_tens_of_megabytes_is_refused_unread(tmp_path):
    path = tmp_path / "precision.yaml"
    with open(path, "wb") as handle:
        handle.write(GOOD.encode() + b"#" * (MAX_FILE_BYTES + 1))
    _refused(path, "larger than 1024 kB")


def test_non_utf8_bytes_are_named_by_offset(tmp_path):
    path = tmp_path / "precision.yaml"
    path.write_bytes(GOOD.encode().replace(b"mxfp8", b"mx\xfffp8"))
    _refused(path, "not UTF-8 text (byte 0xff at offset 15)")


def test_an_alias_bomb_is_refused_before_expansion(tmp_path):
    lines = ["configs: {a: mxfp8}", "matchers: {m: {type: glob, pattern: '*', config: a, enabled: true}}",
             "x0: &a0 [lol]"] + [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 7)]
    path = tmp_path / "precision.yaml"
    path.write_text("\n".join(lines) + "\n")
    _refused(path, "expands to more than 100000 values through YAML aliases")


@pytest.mark.parametrize("payload, expected", [
    ("{format: mxfp8, roundng: stochastic}", "configs.a"),
    ("{format: mxfp8, options: {rounding: sideways}}", "configs.a"),
    ("fp7", "configs.a"),
])
def test_unknown_payload_keys_and_formats_are_refused(tmp_path, payload, expected):
    path = tmp_path / "precision.yaml"
    path.write_text(f"configs: {{a: {payload}}}\nmatchers: {{m: {{type: glob, pattern: '*', config: a, "
                    f"enabled: true}}}}\n")
    _refused(path, expected)


@pytest.mark.parametrize("matcher, expected", [
    ("{type: glob, pattern: 5, config: a, enabled: true}", "matchers.m.pattern: expected a non-empty string, got 5"),
    ("{type: glob, pattern: [x], config: a, enabled: true}", "matchers.m.pattern: expected a non-empty string"),
    ("{type: glob, pattern: '*', config: [a], enabled: true}", "matchers.m.config: expected a non-empty string"),
    ("{type: glob, pattern: '*', config: a, enabled: 'false'}", "matchers.m.enabled: expected true or false, got "
                                                                "'false'"),
])
def test_matcher_values_of_the_wrong_type_are_refused_before_the_model(tmp_path, matcher, expected):
    # unchecked, a numeric pattern loads and fails in fnmatch when the model is built; a quoted "false" enables
    path = tmp_path / "precision.yaml"
    path.write_text(f"configs: {{a: mxfp8}}\nmatchers: {{m: {matcher}}}\n")
    _refused(path, expected)


def test_a_regex_matcher_is_refused_so_no_pattern_can_backtrack(tmp_path):
    # megatron-core builds glob matchers only (fnmatch's translation cannot backtrack catastrophically)
    path = tmp_path / "precision.yaml"
    path.write_text("configs: {a: mxfp8}\nmatchers: {m: {type: regex, pattern: '(a+)+$', config: a, enabled: true}}\n")
    _refused(path, "matchers: Match type 'regex' not implemented")


PATHS = ["decoder.layers.0.self_attention.linear_qkv", "decoder.layers.0.mlp.linear_fc1",
         "decoder.layers.0.mlp.linear_fc2", "output_layer"]


def _precision(*patterns):
    recipes = {f"c{i}": QuantRecipe.from_dict({"format": "mxfp8", "name": f"c{i}"}) for i in range(len(patterns))}
    matchers = [GlobMatcher(pattern, f"c{i}") for i, pattern in enumerate(patterns)]
    return PrecisionConfig(matchers, recipes, "mixed", "mixed.yaml")


def test_a_matcher_that_matches_no_module_is_named():
    (problem,) = _precision("*linear_fc3*").matcher_problems(PATHS)
    assert problem.startswith("mixed.yaml: matcher '*linear_fc3*' matches no module of the model")
    assert "'c0' quantizes nothing" in problem


def test_a_matcher_shadowed_by_an_earlier_one_is_named():
    (problem,) = _precision("*mlp*", "*fc1", "*").matcher_problems(PATHS)
    assert "matcher '*fc1' is shadowed" in problem and "'c1'" in problem
    assert _precision("*fc1", "*mlp*", "*").matcher_problems(PATHS) == []


class _Quantized(torch.nn.Module, FinishesInit):
    pass


def test_building_a_model_warns_for_each_idle_matcher():
    model = torch.nn.Module()
    model.decoder = torch.nn.Module()
    model.decoder.fc1 = _Quantized()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_idle_matchers(model, _precision("*fc1", "*fc3"), extra=("output_layer",))
    assert [str(w.message).split(" matches")[0] for w in caught] == ["mixed.yaml: matcher '*fc3'"]


def test_two_precision_files_at_once_are_refused(tmp_path, monkeypatch):
    for key in ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_SCOPE", "CUSTOM_QUANT_RECIPE"):
        monkeypatch.delenv(key, raising=False)
    path = tmp_path / "mixed.yaml"
    path.write_text(GOOD)
    flags = ["--te-precision-config-file", str(path), "--kitchen-config-file", str(path)]
    with pytest.raises(ArgumentError, match="--kitchen-config-file and --te-precision-config-file both choose the "
                                            "precision; give one"):
        check_inputs(TINY + flags)
