"""A damaged checkpoint stops start-up with one line naming the checkpoint, the damaged file
and the intact checkpoints to fall back to (exit status 2, no traceback); --ckpt-step loads
an earlier one."""
import shutil
from pathlib import Path

import pytest

from tests.reliability._faults import assert_one_line_error, python_module

pytestmark = pytest.mark.slow  # every test launches a training process

TINY = ["--model", "llama-tiny", "--num-layers", "1", "--seq-length", "16", "--mock-data",
        "--eval-iters", "0", "--lr", "1e-3", "--log-interval", "1"]


def _train(*extra: str):
    return python_module("megatron.quant.training", *TINY, *extra)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Checkpoints of iterations 1 and 2 (the tracker names 2)."""
    root = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    result = _train("--train-iters", "2", "--save", str(root), "--save-interval", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture
def copy(saved, tmp_path) -> Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(saved, root)
    return root


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:min(100, len(data) // 2)])


@pytest.mark.parametrize("name", ["__0_0.distcp", ".metadata", "metadata.json", "common.pt"])
def test_truncated_file_is_named_with_the_intact_checkpoint(copy, name):
    if not (copy / "iter_0000002" / name).exists():  # megatron-core >= 0.19 keeps it inside __0_0.distcp
        pytest.skip(f"this megatron-core writes no {name}")
    _truncate(copy / "iter_0000002" / name)
    result = _train("--train-iters", "3", "--load", str(copy))
    assert_one_line_error(result, "iter_0000002", name, "intact checkpoints", "iterations 1",
                          "--ckpt-step N")


def test_tracker_naming_a_deleted_iteration_points_to_the_intact_one(copy):
    shutil.rmtree(copy / "iter_0000002")
    result = _train("--train-iters", "3", "--load", str(copy))
    assert_one_line_error(result, "latest_checkpointed_iteration.txt names iteration 2",
                          "iter_0000002 does not exist", "iterations 1", "--ckpt-step N")


def test_no_intact_checkpoint_is_said_so(copy):
    _truncate(copy / "iter_0000001" / "__0_0.distcp")
    _truncate(copy / "iter_0000002" / ".metadata")
    result = _train("--train-iters", "3", "--load", str(copy))
    assert_one_line_error(result, ".metadata", "no intact checkpoint")


def test_ckpt_step_loads_an_earlier_iteration(copy):
    _truncate(copy / "iter_0000002" / "__0_0.distcp")
    result = _train("--train-iters", "3", "--load", str(copy), "--ckpt-step", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stdout and "at iteration 1" in result.stdout


def test_ckpt_step_naming_a_missing_iteration_is_one_line(copy):
    result = _train("--train-iters", "3", "--load", str(copy), "--ckpt-step", "7")
    assert_one_line_error(result, "--ckpt-step 7", "iter_0000007 does not exist", "iterations 1, 2")
