"""Launch scripts check their arguments before starting anything: a missing positional or a
bad flag is one error line (plus the usage line for positionals) and status 2, never torchrun's
traceback, and no training starts."""
import pytest

from tests.reliability._faults import assert_one_line_error, python_module, run_command

TINY = "examples/llama/train_llama_tiny_cpu.sh"
BIG = ["examples/llama/train_llama32_1b_h100_fp8.sh", "examples/llama/train_llama31_8b_h100_fp8.sh"]


def _script(path: str, *args: str):
    return run_command(["bash", path, *args], timeout=120, MASTER_PORT="29598")


def _assert_nothing_started(result) -> None:
    assert "ChildFailedError" not in result.stderr and "torchrun" not in result.stderr, result.stderr[-3000:]
    assert "iteration" not in result.stdout, result.stdout[-3000:]


def test_tiny_script_refuses_a_flag_as_output_dir(tmp_path):
    result = _script(TINY, "--foo", "3")
    line = assert_one_line_error(result, "OUTPUT_DIR", "'--foo'")
    assert result.stderr.splitlines()[-1].startswith("usage: train_llama_tiny_cpu.sh"), result.stderr
    assert line.startswith("train_llama_tiny_cpu.sh: error:")
    _assert_nothing_started(result)


def test_tiny_script_reports_an_unknown_flag_once_before_torchrun(tmp_path):
    out = tmp_path / "run"
    result = _script(TINY, str(out), "--foo", "3")
    assert_one_line_error(result, "unrecognized arguments: --foo 3")
    _assert_nothing_started(result)
    assert not out.exists()


@pytest.mark.parametrize("script", BIG, ids=["1b", "8b"])
@pytest.mark.parametrize("args, missing", [
    (["ckpt", "tb", "MOCK", "MOCK"], "DTYPE is missing"),
    (["ckpt", "tb", "MOCK", "MOCK", "--foo"], "DTYPE is missing: got the flag '--foo'"),
    (["ckpt", "--seed", "3"], "TENSORBOARD_DIR is missing: got the flag '--seed'"),
], ids=["no_dtype", "flag_as_dtype", "flag_as_tensorboard_dir"])
def test_big_scripts_name_the_missing_positional_not_their_own_flags(tmp_path, script, args, missing):
    result = _script(script, *args)
    line = assert_one_line_error(result, missing)
    assert "--use-distributed-optimizer" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].startswith("usage: "), result.stderr
    assert line.startswith(script.rsplit("/", 1)[1])
    _assert_nothing_started(result)


@pytest.mark.parametrize("script", BIG, ids=["1b", "8b"])
def test_big_scripts_report_an_unknown_flag_once_before_torchrun(tmp_path, script):
    result = _script(script, str(tmp_path / "ckpt"), str(tmp_path / "tb"), "MOCK", "MOCK", "bf16", "--foo")
    assert_one_line_error(result, "unrecognized arguments: --foo")
    _assert_nothing_started(result)


def test_check_args_accepts_good_arguments():
    result = python_module("megatron.quant.training", "--check-args", "--model", "llama-tiny", "--mock-data",
                           "--train-iters", "2")
    assert result.returncode == 0 and "arguments OK" in result.stdout, result.stderr[-3000:]
