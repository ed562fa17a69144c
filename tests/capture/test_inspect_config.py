"""nvdlfw-inspect configs: TE's grammar read into entries, bad configs refused in one line, the plan's
checks against the run, and a config from TE's documentation driving a tiny CPU training run."""
import re

import pytest
import yaml

from megatron.quant.capture.inspect_config import InspectConfigError, Schedule, inspect_config_from_dict
from megatron.quant.capture.inspect_plan import resolve_inspect
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe

# TE's LogTensorStats docstring example (transformer_engine/debug/features/log_tensor_stats.py), verbatim,
# with LogFp8TensorStats' and DisableQuantizationGEMM's examples in sections of their own.
TE_EXAMPLE = """
example_tensor_stat_collection:
    enabled: True
    layers:
        layer_name_regex_pattern: .*(fc1|self_attention).*
    transformer_engine:
        LogTensorStats:
            enabled: True
            tensors_struct:
                - tensor: activation
                  stats: [mean]
                  freq: 10
                  start_step: 5
                  end_step: 100
                - tensor: gradient
                  stats: [mean, max, min]
                  freq: 2
                  start_end_list: [[0, 20], [80, 100]]
                - tensor: weight
                  stats: [dynamic_range]
        LogFp8TensorStats:
            enabled: True
            tensors: [activation]
            stats: [mxfp8_underflows%, fp8_block_scaling_scale_inv_max, mxfp8_mse_columnwise]
example_disable_quantization_gemm:
    enabled: True
    layers:
        layer_types: [fc2]
    transformer_engine:
        DisableQuantizationGEMM:
            enabled: True
            gemms: [dgrad, wgrad]
"""


def _config(text=TE_EXAMPLE):
    return inspect_config_from_dict(yaml.safe_load(text), "cfg.yaml")


def test_te_documentation_example_reads_into_entries():
    logged = {(e.feature, e.tensor): [s.logged for s in e.stats] for s in _config().sections for e in s.entries}
    assert logged[("LogTensorStats", "gradient")] == ["mean", "max", "min"]
    assert logged[("LogFp8TensorStats", "activation")] == ["mxfp8_underflows%", "fp8_block_scaling_scale_inv_max",
                                                           "mxfp8_mse_columnwise"]
    sources = [s.source for e in _config().sections[0].entries if e.feature == "LogFp8TensorStats" for s in e.stats]
    assert sources == ["te-mxfp8", "te-fp8-blockwise", "te-mxfp8/columnwise"]


def test_schedule_follows_te_next_enabled_iter():
    # TE: iteration % freq == 0 and start <= iteration <= end, per interval of start_end_list
    assert [s for s in range(12) if Schedule(2, 3, 9).runs_at(s)] == [4, 6, 8]
    assert [s for s in range(30) if Schedule(5, intervals=((0, 6), (20, 25))).runs_at(s)] == [0, 5, 20, 25]
    assert [s for s in range(4) if Schedule(1, 2, -1).runs_at(s)] == [2, 3]


@pytest.mark.parametrize("change,words", [
    (("LogFp8TensorStats", "AutoswitchGemm"), "AutoswitchGemm is refused"),
    (("LogFp8TensorStats", "LogFancyStats"), "unknown feature 'LogFancyStats'"),
    (("[[0, 20], [80, 100]]", "[[0, 20], [100, 80]]"), "start_end_list [[0, 20], [100, 80]] is malformed"),
    (("[[0, 20], [80, 100]]", "[5]"), "start_end_list [5] is malformed"),
    (("tensor: weight", "tensor: query"), "tensor 'query' is unknown; allowed: activation, gradient, weight"),
    (("freq: 10", "freq: 0"), "freq 0 is invalid"),
    (("[mean, max, min]", "[mean, median]"), "stat 'median' is unknown"),
    (("mxfp8_underflows%", "mxfp8_underflow"), "stat 'mxfp8_underflow' is unknown"),
    (("layer_types: [fc2]", "layer_numbers: [0]"), "layers.layer_numbers: [0] is invalid"),
    (("gemms: [dgrad, wgrad]", "gemms: [dgrad]\n            freq: 2"), "unknown option 'freq'"),
])
def test_bad_configs_stop_in_one_line(change, words):
    with pytest.raises(InspectConfigError) as error:
        _config(TE_EXAMPLE.replace(*change))
    assert words in str(error.value) and "\n" not in str(error.value)


def _plan(text, recipe="mxfp8", layers=2):
    precision = PrecisionConfig.uniform(QuantRecipe.from_dict({"format": recipe}))
    return resolve_inspect(_config(text), precision, layers)


@pytest.mark.parametrize("change,recipe,words", [
    ((".*(fc1|self_attention).*", "experts"), "mxfp8", "layer_name_regex_pattern 'experts' matches no layer"),
    (("[fc2]", "[fc]"), "mxfp8", "layer decoder.layers.0.mlp.linear_fc1 is in sections"),
    (("mxfp8_underflows%", "underflows%"), "bf16", "does not quantize it (fprop.input); name a recipe"),
])
def test_run_checks_stop_in_one_line(change, recipe, words):
    with pytest.raises(InspectConfigError, match=re.escape(words)):
        _plan(TE_EXAMPLE.replace(*change), recipe)


def test_disable_quantization_gemm_keeps_those_gemms_in_high_precision():
    precision, plan = _plan(TE_EXAMPLE)
    recipe = precision.configs["mxfp8"]
    fc2, fc1 = recipe.choices("fc2", 1, 2), recipe.choices("fc1", 1, 2)
    assert {k: c.name for k, c in fc2.items()} == {"fprop.input": "mxfp8", "fprop.weight": "mxfp8",
                                                   "dgrad.grad_output": "bf16", "dgrad.weight": "bf16",
                                                   "wgrad.grad_output": "bf16", "wgrad.input": "bf16"}
    assert {c.name for c in fc1.values()} == {"mxfp8"}
    # step = iteration - 1: the activation entry runs at steps 10, 20, ... from 5
    assert plan.request("decoder.layers.0.mlp.linear_fc1", "input", "forward", 10).stats
    assert plan.request("decoder.layers.0.mlp.linear_fc2", "input", "forward", 10) is None


@pytest.mark.parametrize("env,words", [
    ({"TENSOR_INSPECT_CONFIG": "{path}"}, "--tensor-inspect-config and TENSOR_INSPECT_CONFIG both give"),
    ({"TENSOR_SAVE_LAYERS": "0"}, "the inspect config chooses the layers, tensors and steps; unset TENSOR_SAVE_LAYERS"),
])
def test_the_flag_refuses_a_second_choice_of_what_to_capture(tmp_path, env, words):

    from megatron.quant.training.run_config import build_capture
    path = tmp_path / "inspect.yaml"
    path.write_text(TE_EXAMPLE)
    precision = PrecisionConfig.uniform(QuantRecipe.from_dict({"format": "mxfp8"}))
    environ = {key: value.format(path=path) for key, value in env.items()}
    with pytest.raises(ValueError, match=re.escape(words)):
        build_capture(str(path), environ, precision, 2)


def test_the_config_shown_in_docs_runs_here():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "capture.md").read_text()
    section = text[text.index("## For Transformer Engine users"):]
    shown = section[section.index("```yaml") + len("```yaml"):section.index("```", section.index("```yaml") + 7)]
    precision, plan = _plan(shown, "bf16")
    assert plan.request("decoder.layers.1.self_attention.linear_qkv", "grad_output", "backward", 0).stats
    assert precision.configs["bf16"].choices("fc2", 0, 2)["dgrad.grad_output"].name == "bf16"
