"""Capture under faults: a full disk at every write and close, a writer killed mid-file, and two
processes writing into one directory. Training always goes on; nothing is torn or overwritten."""
import builtins
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from megatron.quant import tensor_saver
from tests.reliability._capture_faults import FullDisk, capture_iterations

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _child(*arguments: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.reliability._capture_faults", *arguments], cwd=REPO,
                            env=ENV, **kwargs)


def _lines(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    assert text == "" or text.endswith("\n"), f"torn last line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]


def _capture_on(capture_session, save_dir: Path, mode: str, disk: FullDisk, monkeypatch) -> list[str]:
    """Capture two iterations through ``disk`` and close; the warnings raised on the way."""
    capture_session(save_dir, mode=mode, iterations="every:1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with monkeypatch.context() as patch:
            patch.setattr(builtins, "open", disk.open)
            capture_iterations()  # the "training" goes on whatever the disk does
            tensor_saver.close()  # never raises, also when a manifest's close fails
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("mode", ["full", "stats"])
def test_full_disk_at_every_write_and_close(tmp_path, monkeypatch, mode, capture_session):
    clean = FullDisk(str(tmp_path / "clean"))
    _capture_on(capture_session, tmp_path / "clean", mode, clean, monkeypatch)
    assert clean.events > 6
    for fail_at in range(1, clean.events + 1):
        save_dir = tmp_path / str(fail_at)
        messages = _capture_on(capture_session, save_dir, mode, FullDisk(str(save_dir), fail_at), monkeypatch)
        [message] = messages
        match = re.fullmatch(rf"disk full at {re.escape(str(save_dir / 'bf16'))}: capture stopped after "
                             rf"(\d+) files \((\d+) bytes\)", message)
        assert match, (fail_at, messages)
        lines = _lines(save_dir / "bf16" / "manifest-rank00.jsonl")
        files = sorted(p.name for p in (save_dir / "bf16").glob("*.pt"))
        assert sorted(line["file"] for line in lines if line["file"]) == files
        assert int(match[1]) == len(files) and not list((save_dir / "bf16").glob(".*.tmp"))
        assert int(match[2]) <= sum(p.stat().st_size for p in (save_dir / "bf16").iterdir())
        for name in files:
            assert torch.load(save_dir / "bf16" / name, weights_only=True)["tensor"].shape == (64,)


def test_stats_on_a_full_disk_exits_cleanly(tmp_path):
    child = _child("stats_full", str(tmp_path), stderr=subprocess.PIPE, text=True)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0 and "Traceback" not in err, err
    assert f"disk full at {tmp_path / 'bf16'}: capture stopped after 0 files" in err
    assert len(_lines(tmp_path / "bf16" / "manifest-rank00.jsonl")) == 1


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed meanwhile
        return 0


def test_writer_killed_mid_write_leaves_only_loadable_files(tmp_path):
    child = _child("killed", str(tmp_path))
    directory = Path(tmp_path, "bf16")
    deadline = time.monotonic() + 90
    try:
        # Wait for a finished file and a half-written one, then kill without warning.
        while not (list(directory.glob("*.pt")) and any(map(_size, directory.glob(".*.tmp")))):
            assert child.poll() is None and time.monotonic() < deadline, "the capture process never wrote"
            time.sleep(0.005)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finals = list(directory.glob("*.pt"))
    assert len(finals) == 1 and len(list(directory.glob(".*.tmp"))) == 1
    for path in finals:
        loaded = torch.load(path, weights_only=True)
        assert torch.all(loaded["tensor"] == loaded["metadata"]["iteration"])
    entries = _lines(directory / "manifest-rank00.jsonl")
    assert {e["file"] for e in entries} <= {p.name for p in finals}


def test_two_processes_sharing_a_directory_never_overwrite(tmp_path):
    captures, gate = 30, tmp_path / "go"
    children = [_child("concurrent", str(tmp_path), str(gate), str(captures)) for _ in range(2)]
    time.sleep(0.5)
    gate.touch()
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    lines = _lines(tmp_path / "bf16" / "manifest-rank00.jsonl")
    files = {p.name for p in (tmp_path / "bf16").glob("*.pt")}
    assert len(lines) == len(files) == 2 * captures and {line["file"] for line in lines} == files
    runs = {line["metadata"]["run_id"] for line in lines}
    assert len(runs) == 2 and all(re.fullmatch(r"[0-9a-f]{12}", run) for run in runs)
    for line in lines:
        saved = torch.load(tmp_path / "bf16" / line["file"], weights_only=True)["metadata"]
        assert saved == line["metadata"]  # the file is the one its line describes, not another run's
