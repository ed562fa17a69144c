"""Transformer Engine's published debug configs (te_debug_configs/, copied from TE's own tests) as the lab reads
them: each one runs against an eight-layer run, its FakeQuant and PerTensorScaling turned into the per-module,
per-GEMM formats TE means, or it is refused in one line that says why it cannot mean anything here."""
import re
from pathlib import Path

import pytest
import yaml

from megatron.quant.capture.inspect_config import InspectConfigError, inspect_config_from_dict, load_inspect_config
from megatron.quant.capture.inspect_features import Translation
from megatron.quant.capture.inspect_plan import resolve_inspect
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.recipes.rules import FormatChoice

CONFIGS = Path(__file__).parent / "te_debug_configs"
LAYERS = 8
RUNS = ("disable_fp8_gemms", "disable_fp8_layer", "fake_quantization_config", "log_config", "per_tensor_scaling",
        "perf_config", "stats_collection_test_config", "tensor_manipulation_transformer_engine")
# TE's feature for its own tests (tests/pytorch/debug: registered from a feature_dirs folder of TE's tests)
REFUSED = {"dummy_feature": "unknown feature 'TestDummyFeature'",
           "test_switch_to_nondebug_mode": "unknown feature 'TestDummyFeature'"}


def _resolve(name, recipe="te-fp8-delayed"):
    config = load_inspect_config(str(CONFIGS / f"{name}.yaml"), "--tensor-inspect-config")
    return resolve_inspect(config, PrecisionConfig.uniform(QuantRecipe.from_dict({"format": recipe})), LAYERS)


def test_every_published_config_is_covered():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(RUNS + tuple(REFUSED))


@pytest.mark.parametrize("name", RUNS)
def test_the_published_config_runs(name):
    precision, plan = _resolve(name)
    assert plan.describe().startswith("--tensor-inspect-config=")
    assert precision.configs["te-fp8-delayed"].choices("fc1", 0, LAYERS)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_published_config_is_refused_in_one_line(name):
    with pytest.raises(InspectConfigError) as error:
        _resolve(name)
    message = str(error.value)
    assert REFUSED[name] in message and "\n" not in message and "features of your own" in message


def _formats(precision, role, layer):
    return {key: (c.name, dict(c.options).get("scaling")) for key, c in
            precision.configs["te-fp8-delayed"].choices(role, layer, LAYERS).items()}


def test_fake_quant_becomes_the_formats_of_te_layer_one():
    # layer_numbers: [1] is megatron-core's layer_number 1: decoder.layers.0; FakeQuant's GEMMs run in high
    # precision with the listed operands per-tensor FP8 (TE's fake_quantize), the others in BF16
    precision, plan = _resolve("fake_quantization_config")
    assert _formats(precision, "fc1", 0) == _formats(precision, "fc2", 0) == {
        "fprop.input": ("fp8_e4m3", None), "fprop.weight": ("bf16", None), "dgrad.grad_output": ("fp8_e5m2", None),
        "dgrad.weight": ("bf16", None), "wgrad.grad_output": ("fp8_e5m2", "delayed"),
        "wgrad.input": ("fp8_e4m3", "delayed")}
    assert _formats(precision, "fc1", 1)["fprop.weight"] == ("fp8_e4m3", "delayed")
    assert _formats(precision, "qkv", 0)["fprop.weight"] == ("fp8_e4m3", "delayed")
    assert "decoder.layers.{0}.mlp.linear_fc1, decoder.layers.{0}.mlp.linear_fc2: fprop.input fp8_e4m3 (tensor " \
           "scaling), fprop.weight bf16" in plan.describe()
    built = precision.configs["te-fp8-delayed"].resolve("fc1", 0, LAYERS)["fprop.input"]
    assert (built.name, built.scaling) == ("fp8_e4m3", "tensor")


def test_per_tensor_scaling_switches_delayed_operands_to_current_scaling():
    precision, _ = _resolve("per_tensor_scaling")
    assert _formats(precision, "fc2", 0) == {
        "fprop.input": ("fp8_e4m3", None), "fprop.weight": ("fp8_e4m3", None), "dgrad.grad_output": ("fp8_e5m2", None),
        "dgrad.weight": ("fp8_e4m3", "delayed"), "wgrad.grad_output": ("bf16", None), "wgrad.input": ("bf16", None)}
    assert precision.configs["te-fp8-delayed"].resolve("fc2", 0, LAYERS)["fprop.input"].scaling == "tensor"


def test_per_tensor_scaling_outside_delayed_scaling_is_refused_as_te_asserts():
    with pytest.raises(InspectConfigError, match=re.escape("PerTensorScaling of decoder.layers.0.mlp.linear_fc1's "
                                                           "fprop.input: TE allows it only under delayed scaling")):
        _resolve("per_tensor_scaling", "te-mxfp8")


def test_layer_numbers_count_from_one_as_megatron_core_numbers_te_layers():
    _, plan = _resolve("stats_collection_test_config")
    assert plan.request("decoder.layers.0.mlp.linear_fc1", "input", "forward", 100).stats
    assert plan.request("decoder.layers.1.mlp.linear_fc1", "input", "forward", 100) is None
    assert plan.request("decoder.layers.6.mlp.linear_fc1", "weight", "forward", 100).stats


CUSTOM = """
mine:
  enabled: True
  layers: {layer_numbers: ["1-2"], layer_types: [fc2]}
  tests.capture._inspect_feature:
    HiFloat8Gradients: {enabled: True, gemms: [dgrad, wgrad], rounding: stochastic}
"""


def test_a_feature_of_your_own_is_registered_by_its_module(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(CUSTOM)
    config = load_inspect_config(str(path))
    precision, plan = resolve_inspect(config, PrecisionConfig.uniform(QuantRecipe.from_dict({"format": "mxfp8"})),
                                      LAYERS)
    for layer in (0, 1):
        chosen = precision.configs["mxfp8"].choices("fc2", layer, LAYERS)
        hifp8 = ("hifp8", "stochastic")
        assert {k: (c.name, dict(c.options).get("rounding")) for k, c in chosen.items()} == {
            "fprop.input": ("mxfp8", None), "fprop.weight": ("mxfp8", None), "dgrad.grad_output": hifp8,
            "dgrad.weight": ("mxfp8", None), "wgrad.grad_output": hifp8, "wgrad.input": ("mxfp8", None)}
    assert precision.configs["mxfp8"].choices("fc2", 2, LAYERS)["dgrad.grad_output"].name == "mxfp8"
    assert "dgrad.grad_output hifp8" in plan.describe()
    path.write_text(CUSTOM.replace("stochastic", "upward"))
    with pytest.raises(InspectConfigError, match=r"mine.tests.capture._inspect_feature.HiFloat8Gradients: rounding"):
        load_inspect_config(str(path))
    path.write_text(CUSTOM.replace("tests.capture._inspect_feature", "tests.capture.no_such_module"))
    with pytest.raises(InspectConfigError, match=r"unknown feature or namespace 'tests.capture.no_such_module'"):
        load_inspect_config(str(path))


def test_the_feature_shown_in_docs_runs(tmp_path, monkeypatch):
    text = (Path(__file__).resolve().parents[2] / "docs" / "capture.md").read_text()
    section = text[text.index("### Features of your own"):]
    code = section[section.index("```python") + 9:section.index("```", section.index("```python") + 9)]
    shown = section[section.index("```yaml") + 7:section.index("```", section.index("```yaml") + 7)]
    (tmp_path / "my_lab").mkdir()
    (tmp_path / "my_lab" / "__init__.py").write_text("")
    (tmp_path / "my_lab" / "features.py").write_text(code)
    (tmp_path / "mine.yaml").write_text(shown)
    monkeypatch.syspath_prepend(str(tmp_path))
    precision, _ = resolve_inspect(load_inspect_config(str(tmp_path / "mine.yaml")),
                                   PrecisionConfig.uniform(QuantRecipe.from_dict({"format": "mxfp8"})), LAYERS)
    chosen = precision.configs["mxfp8"].choices("fc2", 3, LAYERS)
    assert {k: c.name for k, c in chosen.items() if c.name == "hifp8"} == {"dgrad.grad_output": "hifp8",
                                                                           "wgrad.grad_output": "hifp8"}


class _Broken:
    def __init__(self, translated):
        self.translated = translated

    def translate(self, options, where):
        return self.translated


@pytest.mark.parametrize("translated, expected", [
    ({"fprop.input": "fp8"}, "returned {'fprop.input': 'fp8'}, not a Translation"),
    (Translation("X", (("fprop.bias", FormatChoice("bf16")),)), "operand 'fprop.bias' is unknown"),
    (Translation("X", (("fprop.input", FormatChoice("fp9")),)), "fprop.input: unknown numeric format 'fp9'"),
])
def test_a_feature_of_your_own_that_translates_into_nonsense_is_refused_at_start(monkeypatch, translated, expected):
    import tests.capture._inspect_feature as module

    monkeypatch.setitem(module.INSPECT_FEATURES, "HiFloat8Gradients", _Broken(translated))
    with pytest.raises(InspectConfigError, match=re.escape(expected)):
        inspect_config_from_dict(yaml.safe_load(CUSTOM), "mine.yaml")
