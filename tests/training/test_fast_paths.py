"""CUSTOM_QUANT_FUSIONS in a training run: the start line names the paths (layers/fusions.py), a bad
value stops the run in one line."""
import pytest

from megatron.quant.training.main import main

ARGV = ["--model", "llama-tiny", "--mock-data", "--seq-length", "32", "--micro-batch-size", "1",
        "--global-batch-size", "1", "--train-iters", "1", "--eval-iters", "0", "--lr", "1e-3"]


@pytest.mark.parametrize("env,recipe,words", [
    ({}, "bf16", "fusions auto: attention=sdpa, rmsnorm=torch, swiglu=eager, rope=eager, cross-entropy=eager"),
    ({}, "mxfp8", "fusions auto: attention=unfused,"),  # P quantized: the exact path
    ({"CUSTOM_QUANT_FUSIONS": "off"}, "bf16", "fusions off: attention=unfused,"),
])
def test_the_start_line_names_the_attention_and_fused_paths(monkeypatch, capsys, env, recipe, words):
    for key, value in {**env, "CUSTOM_QUANT_TYPE": recipe}.items():
        monkeypatch.setenv(key, value)
    main(ARGV)
    start = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("parallel:"))
    assert f"| {words}" in start


def test_a_bad_fusions_value_exits_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CUSTOM_QUANT_FUSIONS", "always")
    with pytest.raises(SystemExit) as exit_info:
        main(ARGV)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == ("megatron-quant-train: error: CUSTOM_QUANT_FUSIONS='always' is not one "
                                               "of auto, off")
