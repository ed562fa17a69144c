"""The run configuration: one table of the variables a run reads, one precedence rule, one frozen tree
printed on the start line and recorded in each checkpoint."""
import dataclasses
import json

import pytest

from megatron.quant.capture.config import ENV_VARS as CAPTURE_VARIABLES
from megatron.quant.recipes.parse import ENV_VARS as RECIPE_VARIABLES
from megatron.quant.training.main import check_inputs
from megatron.quant.training.variables import RECIPE_CHOOSING, RECIPE_NAMING, VARIABLES, environment_of

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]


def test_one_table_lists_every_variable_with_its_role():
    assert set(VARIABLES) == set(RECIPE_VARIABLES) | set(CAPTURE_VARIABLES)
    assert set(VARIABLES.values()) == {"names", "shapes", "runs", "capture"}
    assert RECIPE_NAMING == ("CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_RECIPE")  # what a sweep run replaces
    assert set(RECIPE_CHOOSING) == {"CUSTOM_QUANT_TYPE", "CUSTOM_QUANT_SCOPE", "CUSTOM_QUANT_RECIPE"}
    assert environment_of({"CUSTOM_QUANT_SCOPE": "linear", "HOME": "/x", "TENSOR_SAVE_MODE": ""}) == \
        (("CUSTOM_QUANT_SCOPE", "linear"),)


def test_the_run_configuration_is_one_frozen_tree(monkeypatch, tmp_path):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "mxfp8")
    monkeypatch.setenv("CUSTOM_QUANT_SCOPE", "linear")
    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path))
    config = check_inputs(TINY + ["--seed", "9"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kernels = "torch"
    assert config.environment == (("CUSTOM_QUANT_TYPE", "mxfp8"), ("CUSTOM_QUANT_SCOPE", "linear"),
                                  ("TENSOR_SAVE_ENABLED", "1"), ("TENSOR_SAVE_DIR", str(tmp_path)))
    line = config.describe()
    assert line.startswith(f"configuration: precision mxfp8-linear | capture to {tmp_path} | environment "
                           f"CUSTOM_QUANT_TYPE=mxfp8 CUSTOM_QUANT_SCOPE=linear ") and "precedence: one source" in line
    record = json.loads(json.dumps(config.record(), default=str))  # what the checkpoint writes
    assert record["quant_type"] == "mxfp8-linear" and record["args"]["seed"] == 9
    assert ", seed=9," in record["precision"]["configs"]["mxfp8-linear"]  # --seed keys the rounding
    assert record["capture"]["enabled"] and record["environment"]["CUSTOM_QUANT_SCOPE"] == "linear"
    assert record["shape"]["num_layers"] == config.shape["num_layers"]
