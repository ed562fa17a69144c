"""Output directories that cannot be written are one line (status 2) in the visualizer,
compare_formats and compare_runs; compare_runs reads around damaged runs: a corrupt run.json, an
event file of random bytes (skipped and listed), a truncated one (read to its cut, said in the
table), a loss that turns NaN (flagged diverged) and a NaN baseline (said, not silent)."""
import builtins
import errno
import json
import math
import os

import numpy as np
import pytest

from tests.analysis.capture_fixture import FAST, tiny_run

STEPS = np.arange(1, 41)
LOSS = 3 + np.exp(-STEPS / 10)


def _read_only(monkeypatch, root) -> None:
    """Directories and files under ``root`` cannot be created, as on a read-only file system
    (tests run as root, where a 0o555 directory would still be writable)."""
    real_mkdir, real_open = os.mkdir, builtins.open

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if str(file).startswith(str(root)) and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", open_)


def _events(run_dir, losses, steps=STEPS, record=None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for step, value in zip(steps, losses):
        writer.add_scalar("train/lm loss", float(value), int(step))
    writer.close()
    if record is not None:
        (run_dir / "run.json").write_text(record)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    _events(root / "bf16", LOSS, record=json.dumps({"recipe": "bf16", "status": "finished"}))
    _events(root / "badjson", 1.01 * LOSS, record='{"recipe": "badjson", "status": ')
    _events(root / "nan", np.where(STEPS >= 20, math.nan, 1.02 * LOSS))
    _events(root / "cut", 1.03 * LOSS)
    [cut] = (root / "cut" / "tensorboard").iterdir()
    cut.write_bytes(cut.read_bytes()[:-30])
    (root / "noise" / "tensorboard").mkdir(parents=True)
    (root / "noise" / "tensorboard" / "events.out.tfevents.1.host").write_bytes(
        np.random.default_rng(0).bytes(4096))
    return root


@pytest.fixture(scope="module")
def report(runs_dir, tmp_path_factory):
    from megatron.quant.analysis.runs.report import write_runs_report

    result = write_runs_report(runs_dir, tmp_path_factory.mktemp("report"), "bf16", smoothing=0.0)
    return result, {row["run"]: row for row in result.rows}


def test_random_event_file_is_skipped_and_listed(report):
    result, rows = report
    assert "noise" not in rows
    [(name, reason)] = result.skipped
    assert name == "noise" and "not a TensorBoard event record at byte 0" in reason
    assert "noise" in result.index.read_text()


def test_corrupt_run_json_is_noted_not_a_traceback(report):
    _, rows = report
    assert rows["badjson"]["iterations"] == 40 and "run.json unreadable (JSONDecodeError)" in rows["badjson"]["notes"]


def test_truncated_event_file_is_read_to_its_cut_and_said(report):
    _, rows = report
    assert 0 < rows["cut"]["iterations"] < 40
    assert "truncated at byte" in rows["cut"]["notes"] and "read its first" in rows["cut"]["notes"]


def test_loss_turning_nan_is_flagged_diverged(report):
    _, rows = report
    assert rows["nan"]["diverged"] is True and "loss not finite from iteration 20" in rows["nan"]["notes"]


def test_nan_baseline_is_said(tmp_path):
    from megatron.quant.analysis.runs.report import write_runs_report

    _events(tmp_path / "runs" / "bf16", np.where(STEPS >= 30, math.nan, LOSS))
    _events(tmp_path / "runs" / "mxfp8", 1.01 * LOSS)
    rows = {row["run"]: row for row in write_runs_report(tmp_path / "runs", tmp_path / "report", "bf16").rows}
    assert "baseline bf16's loss not finite from iteration 30: gaps blank from there" in rows["mxfp8"]["notes"]


def test_compare_runs_report_dir_that_is_a_file_is_one_line(runs_dir, tmp_path, capsys):
    from megatron.quant.analysis.cli import main

    target = tmp_path / "report"
    target.write_text("a file")
    assert main(["runs", str(runs_dir), "--output_dir", str(target)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: --output_dir {target} is an existing file, not a directory; "
                                               "give a directory path")


@pytest.fixture(scope="module")
def small_logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs") / "logs"
    tiny_run(root, quant_types=("hifp8",), layers=(0,), ranks=(0,), stats_iterations=(), quantized_copies=False)
    return root


@pytest.mark.parametrize("tool", ["visualizer", "compare_formats", "compare_runs"])
def test_read_only_output_dir_is_one_line(tool, small_logs, runs_dir, tmp_path, monkeypatch, capsys):
    from megatron.quant.analysis.cli import main as visualize
    from megatron.quant.compare.run_whatif import main as compare_formats

    read_only = tmp_path / "ro"
    read_only.mkdir()
    target = read_only / "draw"
    _read_only(monkeypatch, read_only)
    status = {"visualizer": lambda: visualize(["--tensor_dir", str(small_logs), "--output_dir", str(target),
                                               "--analyses", "quick", *FAST]),
              "compare_formats": lambda: compare_formats(["--tensor_dir", str(small_logs), "--output_dir", str(target),
                                                          "--formats", "mxfp8", "--no_plots"]),
              "compare_runs": lambda: visualize(["runs", str(runs_dir), "--output_dir", str(target)])}[tool]()
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert str(target) in err and f"{read_only} cannot be written (Read-only file system); give a writable" in err
    assert list(read_only.iterdir()) == []
