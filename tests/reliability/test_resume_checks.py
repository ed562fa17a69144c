"""Resume mistakes are found at start from the checkpoint's run config, in one line naming both
values and the flag that makes it work (status 2), not deep in megatron-core's loader or at the
first save an hour in: --train-iters below the checkpoint's iteration, another parallel layout
with RNG states restored, another precision with the optimizer state loaded, a --save that is a
file. A checkpoint of another recipe resumes (weights carry over); one already at --train-iters
trains and saves nothing."""
import os

import pytest

TINY = ["--model", "llama-tiny", "--num-layers", "1", "--seq-length", "16", "--mock-data", "--eval-iters", "0",
        "--lr", "1e-3"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from megatron.quant.training.main import main

    root = tmp_path_factory.mktemp("resume") / "checkpoints"
    main([*TINY, "--train-iters", "2", "--save", str(root)])
    return root


def _refused(capsys, *argv: str) -> str:
    from megatron.quant.training.main import main

    with pytest.raises(SystemExit) as exc:
        main([*TINY, *argv, "--check-args"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def _accepted(capsys, *argv: str) -> None:
    from megatron.quant.training.main import main

    assert main([*TINY, *argv, "--check-args"]) == []
    assert "arguments OK" in capsys.readouterr().out


@pytest.mark.slow  # the saved fixture trains a model
def test_train_iters_below_the_checkpoint_is_refused(saved, capsys):
    err = _refused(capsys, "--train-iters", "1", "--load", str(saved))
    assert f"--train-iters 1 is below the iteration of checkpoint {saved}/iter_0000002 (2); give --train-iters 2 " \
           "or more" in err


@pytest.mark.slow  # the saved fixture trains a model
def test_another_tensor_parallel_size_needs_no_load_rng(saved, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = _refused(capsys, "--train-iters", "3", "--load", str(saved), "--tensor-model-parallel-size", "2")
    assert "was saved at TP 1 x PP 1 x DP 1, this run is TP 2 x PP 1 x DP 1" in err and "add --no-load-rng" in err
    _accepted(capsys, "--train-iters", "3", "--load", str(saved), "--tensor-model-parallel-size", "2", "--no-load-rng")


@pytest.mark.slow  # the saved fixture trains a model
def test_another_precision_needs_no_load_optim(saved, capsys):
    err = _refused(capsys, "--train-iters", "3", "--load", str(saved), "--bf16")
    assert "was saved with precision fp32, this run uses bf16" in err and "--no-load-optim" in err
    _accepted(capsys, "--train-iters", "3", "--load", str(saved), "--bf16", "--no-load-optim")


@pytest.mark.parametrize("option", ["--save", "--tensorboard-dir", "--data-cache-path"])
def test_output_paths_that_are_files_are_refused_at_start(tmp_path, capsys, option):
    (tmp_path / "file").write_text("x")
    err = _refused(capsys, "--train-iters", "1", option, str(tmp_path / "file" / "sub"))
    assert f"{option} {tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is an existing file, not a directory" in err


@pytest.mark.slow  # the saved fixture trains a model
def test_another_recipe_resumes_and_a_finished_run_trains_nothing(saved, tmp_path, monkeypatch):
    from megatron.quant.training.main import main

    done = saved / "iter_0000002" / "metadata.json"  # every megatron-core release writes it last
    before = os.stat(done).st_mtime_ns
    assert main([*TINY, "--train-iters", "2", "--load", str(saved), "--save", str(saved)]) == []
    assert os.stat(done).st_mtime_ns == before  # not saved again
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "mxfp8")
    [step] = main([*TINY, "--train-iters", "3", "--load", str(saved), "--save", str(tmp_path / "mx")])
    assert step["iteration"] == 3
