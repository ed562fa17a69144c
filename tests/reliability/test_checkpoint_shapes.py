"""Resuming with another model shape or another amax history length is one line naming the
tensor, both shapes and the flag that differs (status 2), not torch's CheckpointException
(a BaseException) through every rank."""
import re

import pytest

pytestmark = pytest.mark.slow  # trains a checkpoint, then resumes from it per case

TINY = ["--model", "llama-tiny", "--num-layers", "1", "--seq-length", "16", "--mock-data", "--eval-iters", "0",
        "--lr", "1e-3", "--fp8-recipe", "delayed", "--fp8-format", "hybrid"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from megatron.quant.settings.environment import scoped_environ
    from megatron.quant.training.main import main

    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    # exact sums: the Hopper accumulation model (the flags' default) made this one step 4 to 7 s on the CPU
    with scoped_environ({"CUSTOM_QUANT_ACCUMULATE": "exact"}):
        main([*TINY, "--fp8-amax-history-len", "4", "--train-iters", "1", "--save", str(root), "--save-interval",
              "1"])
    return root


@pytest.mark.parametrize("flags, expected", [
    (["--fp8-amax-history-len", "4", "--ffn-hidden-size", "512"],
     r"linear_fc2.weight has shape \[1, 256, 768\] in the checkpoint but \[1, 256, 512\] in this model "
     r"\(--ffn-hidden-size saved 768, now 512\)"),
    (["--fp8-amax-history-len", "8"],
     r"amax_history has shape \[.*4\] in the checkpoint but \[.*8\] in this model \(the amax history length "
     r"differs: saved 4, now 8"),
], ids=["ffn_hidden_size", "amax_history_len"])
def test_resuming_with_another_shape_is_one_line(saved, capsys, flags, expected):
    from megatron.quant.training.main import main

    with pytest.raises(SystemExit) as exc:
        main([*TINY, *flags, "--train-iters", "2", "--load", str(saved)])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"megatron-quant-train: error: checkpoint {saved}/iter_0000001 does not fit this model: ")
    assert re.search(expected, err), err
