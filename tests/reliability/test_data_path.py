"""A ``--data-path`` that is missing, empty, truncated, not an indexed dataset or not a regular
file is one line naming the file at start (``check_data``: the trainer's ``--check-args`` and the
study run it before any run starts), never a traceback in the first step."""
import os

import pytest

from megatron.quant.training.data import check_data
from megatron.quant.training.dataset_files import DatasetError
from megatron.quant.training.preprocess import write_indexed_dataset


@pytest.fixture
def prefix(tmp_path):
    path = str(tmp_path / "data_text_document")
    write_indexed_dataset([[1, 2, 3, 4], [5, 6, 7]], path, vocab_size=258)
    return path


def _truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(keep)


@pytest.mark.parametrize("damage, message", [
    (lambda p: os.remove(p + ".idx"), ".idx: No such file or directory"),
    (lambda p: _truncate(p + ".idx", 0), "is not a megatron-core index (0 bytes, no MMIDIDX header)"),
    (lambda p: _truncate(p + ".idx", 40), ".idx is truncated or damaged (40 bytes, its header needs"),
    (lambda p: _truncate(p + ".bin", 5), ".bin is truncated (5 bytes, the index needs 14)"),
    (lambda p: open(p + ".idx", "wb").write(os.urandom(4096)), "is not a megatron-core index"),
    (lambda p: (os.remove(p + ".bin"), os.mkdir(p + ".bin")), ".bin is not a regular file"),
    (lambda p: (os.remove(p + ".idx"), os.mkfifo(p + ".idx")), ".idx is not a regular file"),  # never opened
])
def test_damaged_dataset_is_one_line_naming_the_file(prefix, damage, message):
    damage(prefix)
    with pytest.raises(DatasetError) as error:
        check_data([prefix])
    assert message in str(error.value) and "\n" not in str(error.value), error.value


def test_empty_dataset_is_refused(tmp_path):
    path = str(tmp_path / "empty")
    write_indexed_dataset([], path, vocab_size=258)
    with pytest.raises(DatasetError, match="holds no documents"):
        check_data([path])


def test_intact_blend_passes(prefix):
    assert check_data(["2", prefix, "1", prefix]) == ([prefix, prefix], [2.0, 1.0])


def test_trainer_refuses_a_truncated_dataset_at_start(prefix, capsys):
    from megatron.quant.training.main import main

    _truncate(prefix + ".bin", 5)
    with pytest.raises(SystemExit) as exc:
        main(["--model", "llama-tiny", "--num-layers", "1", "--data-path", prefix, "--train-iters", "1",
              "--check-args"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == (f"megatron-quant-train: error: --data-path: {prefix}.bin is truncated "
                                           "(5 bytes, the index needs 14)")
