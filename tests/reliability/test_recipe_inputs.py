"""Recipe input checked when it is read: one name rule shared with capture, bounded error
messages and YAML alias expansion, UTF-8 files named in errors, a bounded amax history, and
misspelt CUSTOM_QUANT_* variables refused like misspelt TENSOR_SAVE_* ones."""
import os

import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from megatron.quant.tensor_saver import CaptureSite

CHECK = ["--check-args", "--model", "llama-tiny", "--mock-data", "--train-iters", "2"]
BAD_NAMES = ["a__b", "mxfp8-é", "x" * 240, "_lead", "a b"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=["double_underscore", "unicode", "240_chars", "leading_", "space"])
def test_recipe_refuses_a_name_capture_could_not_use(name):
    with pytest.raises(RecipeError, match=r"name: .* is invalid .*allowed: ASCII letters"):
        QuantRecipe.from_dict({"name": name, "format": "bf16"})


@pytest.mark.parametrize("name", ["mxfp8", "te-fp8-delayed-len16-max", "my_recipe.v2+x", "x" * 64])
def test_a_name_the_recipe_accepts_is_one_capture_accepts(tmp_path, name, capture_session):
    recipe = QuantRecipe.from_dict({"name": name, "format": "bf16"})
    capture_session(iterations="0")
    position.set_iteration(0)
    site = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", recipe.name)
    tensor_saver.capture(site, "forward", "pre", {"input": torch.ones(2)})
    tensor_saver.flush()
    assert len(list((tmp_path / name).glob("*.pt"))) == 1


def _alias_bomb(levels: int) -> str:
    """``scope:`` whose YAML aliases expand to 9**levels strings (the file is a few hundred bytes)."""
    lines = ["scope:", '  - &a0 ["linear"]']
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines + [""])


def test_yaml_alias_bomb_is_refused_before_expansion(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(6))  # 531441 values: big enough to refuse, small enough to expand cheaply
    with pytest.raises(RecipeError, match=r"expands to more than 100000 values through YAML aliases") as error:
        QuantRecipe.from_file(path)
    assert len(str(error.value)) < 300


def test_a_recipe_file_that_is_no_regular_file_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")  # read as before, a FIFO with no writer hung the run's start
    with pytest.raises(RecipeError, match="fifo.yaml: is a FIFO; give a regular file"):
        QuantRecipe.from_file(tmp_path / "fifo.yaml")
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(RecipeError, match="dir.yaml: is a directory"):
        QuantRecipe.from_file(tmp_path / "dir.yaml")


def test_error_messages_show_a_bounded_excerpt_of_a_value(tmp_path):
    path = tmp_path / "wide.yaml"
    path.write_text(_alias_bomb(4))  # 6561 values: under the bound, refused as a scope
    with pytest.raises(RecipeError, match=r"invalid scope") as error:
        QuantRecipe.from_file(path)
    assert len(str(error.value)) < 500


def _check_args(monkeypatch, capsys, *extra: str, **env: str) -> str:
    from megatron.quant.training.main import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        main([*CHECK, *extra])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_non_utf8_recipe_names_the_variable_and_the_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\nformat: mxfp8\n".encode("latin-1"))
    err = _check_args(monkeypatch, capsys, CUSTOM_QUANT_RECIPE=str(path))
    assert f"CUSTOM_QUANT_RECIPE={path}" in err and "not UTF-8" in err and "0xe9" in err


def test_sweep_names_a_non_utf8_recipe_file(tmp_path, capsys):
    from megatron.quant.lab.sweep import main

    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\nformat: mxfp8\n".encode("latin-1"))
    assert main([str(tmp_path / "out"), str(path), "--", "--model", "llama-tiny", "--train-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err and "not UTF-8" in err
    assert not (tmp_path / "out").exists()


def test_amax_history_length_is_bounded(monkeypatch, capsys):
    err = _check_args(monkeypatch, capsys, "--fp8-recipe", "delayed", "--fp8-format", "hybrid",
                      "--fp8-amax-history-len", "100000000")
    assert "--fp8-amax-history-len must be 1..65536, got 100000000" in err


def test_amax_history_length_in_a_recipe_is_bounded():
    with pytest.raises(RecipeError, match=r"amax_history_len=100000000 must be at most 65536"):
        QuantRecipe.from_dict({"format": "te-fp8-delayed", "options": {"amax_history_len": 10**8}})


def test_misspelt_custom_quant_variable_is_refused(monkeypatch, capsys):
    err = _check_args(monkeypatch, capsys, CUSTOM_QUANT_TPYE="mxfp8")
    assert "unknown recipe variable(s) CUSTOM_QUANT_TPYE; known: CUSTOM_QUANT_TYPE" in err
