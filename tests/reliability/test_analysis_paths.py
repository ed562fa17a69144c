"""The visualizer and compare_formats read only regular files inside --tensor_dir: manifest
entries leading out of it and FIFOs named *.pt are skipped and listed, never opened."""
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.analysis.capture_fixture import FAST, tiny_run
from tests.reliability._faults import python_module


def _small_run(root: Path) -> list[Path]:
    return tiny_run(root, quant_types=("hifp8",), layers=(0,), ranks=(0,), stats_iterations=(),
                    quantized_copies=False)


def _report_skipped(out: Path) -> dict[str, str]:
    run = json.loads((out / ".report" / "report.json").read_text())["run"]
    return {entry["path"]: entry["reason"] for entry in run["skipped"]}


@pytest.fixture
def escaping_logs(tmp_path) -> tuple[Path, list[str]]:
    """A capture directory whose manifest also lists two valid captures lying outside it: one
    by absolute path, one by ``../``; returns the directory and the two entries as written."""
    root = tmp_path / "logs"
    files = _small_run(root)
    (tmp_path / "outside").mkdir()
    targets = [(tmp_path / "outside" / "absolute.pt", str(tmp_path / "outside" / "absolute.pt")),
               (tmp_path / "dotdot.pt", "../../dotdot.pt")]  # relative to logs/hifp8/
    manifest = files[0].parent / "manifest-rank00.jsonl"
    lines = manifest.read_text().splitlines()
    for number, (target, written) in enumerate(targets):
        shutil.copy(files[number], target)
        entry = json.loads(lines[number])
        entry["file"] = written
        entry["metadata"]["tensor_name"] = f"escaped{number}"
        lines.append(json.dumps(entry))
    manifest.write_text("\n".join(lines) + "\n")
    return root, [written for _, written in targets]


def test_visualizer_skips_and_lists_manifest_entries_outside_the_tensor_dir(escaping_logs, tmp_path, capsys):
    from megatron.quant.analysis.cli import main

    root, entries = escaping_logs
    out = tmp_path / "draw"
    assert main(["--tensor_dir", str(root), "--output_dir", str(out), "--analyses", "quick", *FAST]) == 0
    skipped = _report_skipped(out)
    for entry in entries:
        [(path, reason)] = [(p, r) for p, r in skipped.items() if p.endswith(Path(entry).name)]
        assert "outside the tensor directory" in reason, (path, reason)
    index = (out / "index.html").read_text()
    assert "escaped0" not in index and "escaped1" not in index  # never analysed
    assert "2 file(s) skipped" in capsys.readouterr().out


def test_compare_formats_skips_and_lists_manifest_entries_outside_the_tensor_dir(escaping_logs, tmp_path):
    from megatron.quant.compare.run_whatif import build_parser, run

    root, entries = escaping_logs
    log: list[str] = []
    run(build_parser().parse_args(["--tensor_dir", str(root), "--output_dir", str(tmp_path / "draw"),
                                   "--formats", "mxfp8", "--no_plots"]), log.append)
    for entry in entries:
        assert any(Path(entry).name in line and "outside the tensor directory" in line for line in log), log
    table = (tmp_path / "draw" / "format_comparison" / "format_comparison.csv").read_text()
    assert "escaped" not in table


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed_in_manifest"])
def test_fifo_named_pt_is_skipped_and_listed_not_opened(tmp_path, listed):
    root = tmp_path / "logs"
    files = _small_run(root)
    fifo = files[0].parent / files[0].name.replace("_0000_", "_9000_")
    os.mkfifo(fifo)
    if listed:
        manifest = files[0].parent / "manifest-rank00.jsonl"
        entry = json.loads(manifest.read_text().splitlines()[0])
        entry["file"] = fifo.name
        manifest.write_text(manifest.read_text() + json.dumps(entry) + "\n")
    out = tmp_path / "draw"
    # A reader that opens the FIFO blocks forever: the timeout turns that into a failure.
    result = python_module("megatron.quant.analysis", "--tensor_dir", str(root), "--output_dir", str(out),
                           "--analyses", "quick", *FAST, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    [reason] = [r for p, r in _report_skipped(out).items() if p.endswith(fifo.name)]
    assert "FIFO" in reason and "not a regular file" in reason


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_load_capture_refuses_a_fifo_without_opening_it(tmp_path):
    from megatron.quant.analysis.captures.loading import CaptureLoadError, load_capture

    fifo = tmp_path / "x.pt"
    os.mkfifo(fifo)
    outcome: dict[str, str] = {}

    def load() -> None:
        try:
            load_capture(fifo)
        except CaptureLoadError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(30)
    blocked = thread.is_alive()
    if blocked:  # a writer that closes at once gives the blocked reader EOF, ending the thread
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
    assert not blocked, "load_capture blocked opening a FIFO"
    assert "FIFO" in outcome["error"]
