"""Role and tensor filters that can never match stop training at start, as layer and rank
filters do; --check-args (and so the launch scripts) refuses an unusable capture directory
before torchrun starts."""
import pytest

from tests.reliability._faults import assert_one_line_error, run_command

TINY = ["--model", "llama-tiny", "--mock-data", "--train-iters", "2"]


@pytest.mark.parametrize("env, expected", [
    ({"TENSOR_SAVE_ROLES": "output_layer"},
     "TENSOR_SAVE_ROLES=output_layer can never match: the run captures roles qkv, proj, fc1, fc2, core_attention "
     "(output_layer only when the recipe quantizes it)"),
    ({"TENSOR_SAVE_ROLES": "fc1", "TENSOR_SAVE_TENSORS": "query", "TENSOR_SAVE_EXIT_AFTER": "1"},
     "TENSOR_SAVE_TENSORS=query can never match: roles fc1 capture input, weight, output, grad_output"),
    ({"TENSOR_SAVE_ROLES": "core_attention", "TENSOR_SAVE_TENSORS": "grad_weight"},
     "TENSOR_SAVE_TENSORS=grad_weight can never match: roles core_attention capture query, key, value"),
], ids=["unquantized_output_layer", "fc1_query", "attention_grad_weight"])
def test_role_and_tensor_filters_that_can_never_match_stop_at_start(tmp_path, monkeypatch, capsys, env, expected):
    from megatron.quant.training.main import main

    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path / "captures"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        main(["--check-args", *TINY])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("megatron-quant-train: error: ") and expected in err, err


def test_output_layer_filter_is_accepted_when_the_recipe_quantizes_it(tmp_path, monkeypatch, capsys):
    from megatron.quant.training.main import main

    recipe = tmp_path / "head.yaml"
    recipe.write_text("format: mxfp8\nrules:\n  - match: {roles: [output_layer]}\n    format: mxfp8\n")
    for key, value in {"TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_DIR": str(tmp_path / "captures"),
                       "TENSOR_SAVE_ROLES": "output_layer", "CUSTOM_QUANT_RECIPE": str(recipe)}.items():
        monkeypatch.setenv(key, value)
    assert main(["--check-args", *TINY]) == [] and "arguments OK" in capsys.readouterr().out


def test_launch_script_refuses_a_capture_dir_that_is_a_file_before_torchrun(tmp_path):
    target = tmp_path / "captures"
    target.write_text("a file")
    out = tmp_path / "run"
    result = run_command(["bash", "examples/llama/train_llama_tiny_cpu.sh", str(out)], timeout=120,
                         MASTER_PORT="29597", TENSOR_SAVE_ENABLED="1", TENSOR_SAVE_DIR=str(target))
    assert_one_line_error(result, f"TENSOR_SAVE_DIR='{target}' is unusable: it is a file")
    assert "ChildFailedError" not in result.stderr and "torchrun" not in result.stderr
    assert not out.exists()
