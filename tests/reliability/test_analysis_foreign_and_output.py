"""compare_formats skips and lists a capture it cannot use (a 0-d tensor) like the report does;
an output directory that is an existing file is a one-line error (status 2) in both tools."""
import csv
import sys
from pathlib import Path

import pytest
import torch

from tests.analysis.capture_fixture import FAST, tiny_run
from tests.reliability._faults import assert_one_line_error, run_command


@pytest.fixture
def logs_with_scalar(tmp_path) -> tuple[Path, str]:
    """A small capture directory plus one capture holding a 0-d tensor; (directory, its name)."""
    root = tmp_path / "logs"
    files = tiny_run(root, quant_types=("hifp8",), layers=(0,), ranks=(0,), stats_iterations=(),
                     quantized_copies=False)
    payload = torch.load(files[0], weights_only=True)
    scalar = files[0].parent / files[0].name.replace("_0000_", "_9000_")
    torch.save({"tensor": torch.tensor(1.5), "metadata": dict(payload["metadata"], shape=[])}, scalar)
    return root, scalar.name


def _compare(*args: str):
    return run_command([sys.executable, "script/compare_formats.py", *args], timeout=300)


def test_compare_formats_skips_and_lists_a_0d_capture(logs_with_scalar, tmp_path):
    root, name = logs_with_scalar
    out = tmp_path / "draw"
    result = _compare("--tensor_dir", str(root), "--output_dir", str(out), "--formats", "mxfp8", "--no_plots")
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(name in line and "0-d" in line for line in result.stdout.splitlines()), result.stdout
    folder = out / "format_comparison"
    with open(folder / "skipped_files.csv") as f:
        skipped = {row["path"]: row["reason"] for row in csv.DictReader(f)}
    [reason] = [r for p, r in skipped.items() if p.endswith(name)]
    assert "0-d" in reason
    assert name in (folder / "summary.html").read_text() and name in (folder / "summary.md").read_text()
    assert name not in (folder / "format_comparison.csv").read_text()


def test_visualizer_output_dir_that_is_a_file_is_one_line(logs_with_scalar, tmp_path):
    root, _ = logs_with_scalar
    target = tmp_path / "draw"
    target.write_text("not a directory")
    result = run_command(["bash", "script/one_click_visualize.sh", str(root), str(target), *FAST])
    assert_one_line_error(result, str(target), "not a directory")


@pytest.mark.parametrize("inside", [False, True], ids=["output_dir", "format_comparison"])
def test_compare_formats_output_dir_that_is_a_file_is_one_line(logs_with_scalar, tmp_path, inside):
    root, _ = logs_with_scalar
    target = tmp_path / "draw" / "format_comparison" if inside else tmp_path / "draw"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("not a directory")
    result = _compare("--tensor_dir", str(root), "--output_dir", str(tmp_path / "draw"), "--formats", "mxfp8")
    assert_one_line_error(result, str(target), "not a directory")
