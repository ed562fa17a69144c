"""An inspect config driving capture: the TE-named statistics log of a step (micro-batches folded, a
weight once, what-if recipes), and nvdlfw-inspect's own example config running a tiny CPU training."""
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from megatron.quant import formats, position, tensor_saver
from megatron.quant.capture.inspect_config import inspect_config_from_dict
from megatron.quant.capture.te_log import log_path
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite, Operand, SaverConfig

FC1 = "decoder.layers.0.mlp.linear_fc1"
CONFIG = """
fc1:
  enabled: True
  layers: {layer_types: [linear_fc1]}
  transformer_engine:
    LogTensorStats: {enabled: True, tensors: [activation, weight], stats: [cur_amax, l1_norm], freq: 2}
    LogFp8TensorStats:
      enabled: True
      tensors_struct:
        - {tensor: activation, stats: [underflows%, mxfp8_underflows%, fp8_current_scaling_scale_inv_max]}
    LogNvfp4TensorStats: {enabled: True, tensors: [activation], stats: [underflows%]}
"""
LINE = re.compile(r"INFO - (\S+) \t\t\t\t iteration=(\d{6}) \t\t\t\t value=(\S+)")


def _log(tmp_path) -> dict:
    found = {}
    for line in Path(log_path(str(tmp_path), 0)).read_text().splitlines():
        name, step, value = LINE.fullmatch(line).groups()
        found[(name, int(step))] = float(value)
    return found


def test_a_step_is_logged_under_te_names_folded_over_micro_batches(tmp_path):
    from megatron.quant.capture.inspect_plan import resolve_inspect
    precision = PrecisionConfig.uniform(QuantRecipe.from_dict({"format": "fp8_e4m3"}))
    config = SaverConfig(save_dir=str(tmp_path), inspect=inspect_config_from_dict(yaml.safe_load(CONFIG),
                                                                                                "cfg"))
    _, plan = resolve_inspect(config.inspect, precision, num_layers=1)
    tensor_saver.configure(config, plan=plan)
    site = CaptureSite("linear", "linear", 0, FC1, "fc1", "fp8_e4m3")
    fmt = formats.get_format("fp8_e4m3")
    weight = torch.nn.Parameter(torch.linspace(-1, 1, 64).reshape(2, 32))
    inputs = [torch.full((4, 32), 0.5), torch.full((4, 32), -2.0)]
    inputs[1][0, 0] = 2.0 ** -20  # flushed to zero by E4M3 at the scale of 2.0 (scale 2/448)
    try:
        for iteration in (1, 2):  # TE's steps 0 and 1
            position.set_iteration(iteration)
            for mb, x in enumerate(inputs):
                position.set_microbatch(mb, first_sample=mb)
                assert tensor_saver.is_active()
                tensor_saver.capture(site, "forward", "pre", {"input": Operand(x, fmt), "weight": Operand(weight, fmt)})
            summary = tensor_saver.iteration_summary()
        assert summary[f"{FC1}_activation_underflows%"] == pytest.approx(100 / 256)
        assert summary["whatif/te-mxfp8/fc1/input/underflow_ratio"] == pytest.approx(1 / 256)
    finally:
        tensor_saver.close()
    logged = _log(tmp_path)
    assert logged[(f"{FC1}_activation_cur_amax", 0)] == 2.0  # the larger micro-batch's
    assert logged[(f"{FC1}_activation_l1_norm", 0)] == pytest.approx(4 * 32 * 0.5 + 2.0 * 127 + 2.0 ** -20, rel=1e-5)
    assert logged[(f"{FC1}_weight_l1_norm", 0)] == pytest.approx(float(weight.abs().sum()), rel=1e-5)  # once
    assert (f"{FC1}_activation_cur_amax", 1) not in logged  # freq 2: steps 0, 2, ...
    assert logged[(f"{FC1}_activation_underflows%", 1)] == pytest.approx(100 / 256, rel=1e-5)
    assert logged[(f"{FC1}_activation_mxfp8_underflows%", 0)] == pytest.approx(100 / 256, rel=1e-5)
    assert logged[(f"{FC1}_activation_fp8_current_scaling_scale_inv_max", 0)] == pytest.approx(2 / 448, rel=1e-5)
    assert (f"{FC1}_activation_nvfp4_underflows%", 0) in logged


# nvdlfw-inspect's examples/configs/multi_tensor_stat_collection.yaml, verbatim.
NVDLFW_EXAMPLE = """
multi_tensor_stat_collection:
  enabled: True
  layers:
    layer_name_regex_pattern: .*(fc1|self_attention).*
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
        freq: 10
        start_step: 5
        end_step: 100
  transformer_engine:
    LogTensorStats:
      enabled: True
      tensors: [activation, gradient]
      stats: [dynamic_range, cur_amax]
      freq: 20
      start_step: 0
      end_step: 80
"""


def test_nvdlfw_inspect_example_runs_a_tiny_training(tmp_path, monkeypatch):
    from megatron.quant.training.main import main
    config = tmp_path / "multi_tensor_stat_collection.yaml"
    config.write_text(NVDLFW_EXAMPLE)
    for key, value in {"CUSTOM_QUANT_TYPE": "mxfp8", "TENSOR_SAVE_DIR": str(tmp_path / "logs")}.items():
        monkeypatch.setenv(key, value)
    main(["--model", "llama-tiny", "--num-layers", "1", "--mock-data", "--seq-length", "16", "--micro-batch-size", "1",
          "--global-batch-size", "2", "--train-iters", "2", "--eval-iters", "0", "--lr", "1e-3",
          "--tensor-inspect-config", str(config)])
    logged = _log(tmp_path / "logs")
    layers = ("decoder.layers.0.self_attention.linear_qkv", "decoder.layers.0.self_attention.linear_proj",
              "decoder.layers.0.mlp.linear_fc1")
    expected = {(f"{layer}_{tensor}_{stat}", 0) for layer in layers for tensor in ("activation", "gradient")
                for stat in ("dynamic_range", "cur_amax")}
    assert set(logged) == expected  # step 1 logs nothing (freq 20; the base entries start at step 5)
    manifest = [json.loads(line)["metadata"] for line in (tmp_path / "logs" / "mxfp8" / "manifest-rank00.jsonl").open()]
    inputs = [m["stats"] for m in manifest if m["module"] == layers[2] and m["tensor_name"] == "input"]
    assert len(inputs) == 2 and {m["iteration"] for m in manifest} == {1}  # two micro-batches of iteration 1
    assert logged[(f"{layers[2]}_activation_cur_amax", 0)] == pytest.approx(max(s["absmax"] for s in inputs), rel=1e-5)
    low = min(math.log2(s["absmax"]) - s["dynamic_range_log2"] for s in inputs)
    assert logged[(f"{layers[2]}_activation_dynamic_range", 0)] == pytest.approx(
        math.log2(max(s["absmax"] for s in inputs)) - low, rel=1e-5)


def test_whatif_formats_of_a_bf16_operand(tmp_path, capture_session):
    """TENSOR_SAVE_WHATIF: one unquantized activation's statistics under MXFP8 and TE's current scaling,
    against values worked out by hand."""
    capture_session(mode="stats", whatif=("mxfp8", "fp8_current_scaling"), iterations="1")
    x = torch.ones(2, 32)
    x[0, 31] = 2.0 ** -20  # MXFP8 block scale 2**-8 (amax 1): 2**-12 is below half of E4M3's 2**-9
    x[1, 0] = 448.0  # current scaling: scale 1, 2**-20 also flushed; MXFP8: a block of its own (scale 2**0)
    position.set_iteration(1)
    position.set_microbatch(0, first_sample=0)
    tensor_saver.capture(CaptureSite("linear", "linear", 0, FC1, "fc1", "bf16"), "forward", "pre", {"input": x})
    summary = tensor_saver.iteration_summary()
    tensor_saver.flush()
    (entry,) = [json.loads(line)["metadata"] for line in (tmp_path / "bf16" / "manifest-rank00.jsonl").open()]
    whatif = entry["stats"]["whatif"]
    assert whatif["mxfp8"]["underflow"] == 1 and whatif["mxfp8"]["overflow"] == 0
    assert whatif["mxfp8"]["scale_min"] == 2.0 ** -8 and whatif["mxfp8"]["scale_max"] == 1.0
    assert whatif["fp8_current_scaling"]["underflow"] == 1 and whatif["fp8_current_scaling"]["scale_max"] == 1.0
    assert summary["whatif/mxfp8/fc1/input/underflow_ratio"] == 1 / 64
    assert "block_scales" not in entry["stats"]  # the run's own operand is not block-quantized


@pytest.mark.parametrize("block_scales", [True, False])
def test_stats_mode_adds_block_scales_of_block_formats(tmp_path, capture_session, block_scales):
    capture_session(mode="stats", stats="sample", block_scales=block_scales, iterations="1")
    fmt = formats.get_format("mxfp8_e4m3")
    position.set_iteration(1)
    position.set_microbatch(0, first_sample=0)
    tensor_saver.capture(CaptureSite("linear", "linear", 0, FC1, "fc1", "mxfp8"), "forward", "pre",
                         {"input": Operand(torch.ones(4, 64), fmt)})
    tensor_saver.flush()
    (entry,) = [json.loads(line)["metadata"] for line in (tmp_path / "mxfp8" / "manifest-rank00.jsonl").open()]
    if block_scales:  # amax 1: every scale 2**-8, every block one value wide
        assert entry["stats"]["block_scales"]["blocks"] == 8 and entry["stats"]["block_scales"]["scale_max"] == 2 ** -8
        assert entry["stats"]["block_scales"]["range_log2_max"] == 0.0
    else:
        assert "block_scales" not in entry["stats"]


def test_whatif_layer_rules_count_from_the_models_layers():
    """``te-nvfp4+bf16-layers`` keeps the first and the last decoder layer in BF16 (``0:1``, ``-1:``): the
    last is the model's, not the captured layer (which had made every layer the last)."""
    from megatron.quant.capture.whatif import WhatIfFormats

    formats = WhatIfFormats(num_layers=16)
    found = {layer: formats.format_for("te-nvfp4+bf16-layers", "m", "fc1", layer, "input") for layer in (0, 3, 15)}
    assert found[0] is None and found[15] is None
    assert found[3][0].name == "nvfp4"
    assert WhatIfFormats().format_for("te-nvfp4", "m", "fc1", 3, "input")[0].name == "nvfp4"  # no rules: no count
    with pytest.raises(ValueError, match="'te-nvfp4\\+bf16-layers' has layer rules: the model's layer count"):
        WhatIfFormats().format_for("te-nvfp4+bf16-layers", "m", "fc1", 3, "input")


def test_whatif_gives_the_lm_head_its_own_format_not_a_decoder_layers():
    """The head is no decoder layer: ``te-nvfp4+bf16-layers``' BF16 first layer is not its format (it had
    been resolved as layer 0's fc2, so that what-if left it unquantized); a rule naming ``output_layer``
    is."""
    from megatron.quant.capture import whatif

    resolver = whatif.WhatIfFormats(num_layers=16)
    weight, axis = resolver.format_for("te-nvfp4+bf16-layers", "output_layer", "output_layer", -1, "weight")
    assert weight.name == "nvfp4" and tuple(weight.options["block_shape"]) == (16, 16) and axis == 1
    assert resolver.format_for("te-nvfp4+bf16-layers", "m", "fc2", 0, "weight") is None  # layer 0 itself: BF16
    named = QuantRecipe.from_dict({"format": "fp8_e4m3", "rules": [
        {"match": {"roles": ["output_layer"]}, "format": "mxfp8"},
        {"match": {"layers": ["0"]}, "format": "none"}]})
    assert whatif._head_choice(named, "fprop.input", 16).name == "mxfp8"
    assert whatif._head_choice(dataclasses.replace(named, rules=named.rules[1:]), "fprop.input", 16).name == "fp8_e4m3"
