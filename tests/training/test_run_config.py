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


def test_every_flag_is_a_typed_field_of_one_section():
    from megatron.quant.training.arguments import parse_args, validate_args
    from megatron.quant.training.run_tree import SECTIONS

    fields = [item.name for section in SECTIONS.values() for item in dataclasses.fields(section)]
    assert len(fields) == len(set(fields))
    assert set(vars(validate_args(parse_args(TINY), 1, cuda=False))) - {"notices"} == set(fields)


def test_the_tree_takes_flag_then_environment_then_file_then_default(clean_env):
    from megatron.quant.training.run_tree_build import build_run_tree

    environ = {"CUSTOM_QUANT_TYPE": "mxfp8", "WORLD_SIZE": "2", "HOME": "/x"}
    tree = build_run_tree(TINY + ["--num-layers", "4", "--seed", "1234", "--use-distributed-optimizer"], environ,
                          cuda=False)
    assert not tree.optimizer.use_distributed_optimizer  # CPU: a notice, and the source says so
    assert tree.sources["optimizer.use_distributed_optimizer"] == \
        "flag --use-distributed-optimizer, adjusted (see the notices)"
    assert (tree.model.num_layers, tree.sources["model.num_layers"]) == (4, "flag --num-layers")
    assert tree.sources["schedule.seed"] == "flag --seed"  # given at its default value: still the flag
    assert (tree.model.hidden_size, tree.sources["model.hidden_size"]) == (256, "file preset llama-tiny")
    assert (tree.optimizer.lr, tree.sources["optimizer.lr"]) == (3e-4, "default")
    assert (tree.quant.type, tree.sources["quant.type"]) == ("mxfp8", "environment CUSTOM_QUANT_TYPE")
    assert (tree.quant.kernels, tree.sources["quant.kernels"]) == (None, "default")
    assert tree.parallel.data_parallel_size == 2 and tree.sources["parallel.data_parallel_size"].startswith("derived")
    assert tree.environment.launcher == {"WORLD_SIZE"}  # RANK and LOCAL_RANK keep their defaults
    assert dict(tree.environment.settings) == {"CUSTOM_QUANT_TYPE": "mxfp8"}  # only the package's variables
    from megatron.quant.training.run_tree import QuantSection, quant_variable

    assert [quant_variable(item.name) for item in dataclasses.fields(QuantSection)] == list(RECIPE_VARIABLES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.model.num_layers = 8


def test_print_config_shows_the_tree_with_sources_and_trains_nothing(clean_env, capsys):
    """The example of docs/training.md, run as shown: every line it shows is printed, and nothing trains."""
    import re
    import shlex
    from pathlib import Path

    from megatron.quant.training.main import main

    guide = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    section = guide[guide.index("## The run configuration and `--print-config`"):]
    command, shown = re.findall(r"```(?:bash|text)\n(.*?)```", section, re.S)[:2]
    words = shlex.split(command.replace("\\\n", " "))
    program = words.index("megatron-quant-train")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):  # as in a shell without a launcher
        clean_env.delenv(name, raising=False)
    for assignment in words[:program]:
        clean_env.setenv(*assignment.split("=", 1))
    assert main(words[program + 1:]) == []
    printed = capsys.readouterr().out.splitlines()
    expected = [line for line in shown.splitlines() if line != "..."]
    assert expected and [line for line in expected if line not in printed] == []
    assert printed[0].startswith("[model]") and not any(line.startswith(("model:", "iteration")) for line in printed)


def test_the_layers_take_the_kernel_path_from_the_configuration_not_the_environment(clean_env):
    from megatron.quant import formats
    from megatron.quant.formats.compiled import CompiledFormat
    from megatron.quant.layers.module_quant import format_builder

    clean_env.setenv("CUSTOM_QUANT_KERNELS", "torch")
    precision = check_inputs(TINY).precision
    assert {recipe.kernels for recipe in precision.configs.values()} == {"torch"}
    (recipe,) = precision.configs.values()
    fmt = formats.get_format("mxfp8")
    clean_env.setenv("CUSTOM_QUANT_KERNELS", "compile")  # changed after the configuration was built
    assert format_builder(recipe)(fmt) is fmt  # the run's choice: eager torch
    assert isinstance(format_builder(dataclasses.replace(recipe, kernels=None))(fmt), CompiledFormat)  # library use


def test_the_one_reader_keeps_every_variable_the_readers_know():
    from megatron.quant.settings.environment import read_environment

    environ = {name: "x" for name in VARIABLES} | {"CUSTOM_QUANT_TPYE": "x", "PATH": "/bin", "RANK": "3"}
    environment = read_environment(environ)
    assert set(environment.settings) == set(VARIABLES) | {"CUSTOM_QUANT_TPYE"}  # a misspelling is refused later
    assert (environment.rank, environment.world_size, environment.first_rank()) == (3, 1, False)
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not a non-negative integer"):
        read_environment({"WORLD_SIZE": "two"})


def test_a_bad_launcher_variable_is_a_one_line_error(clean_env, capsys):
    from megatron.quant.training.main import main

    clean_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(SystemExit) as exit_:
        main(TINY)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "megatron-quant-train: error: WORLD_SIZE='two' is not a non-negative integer (torchrun sets it)"]
