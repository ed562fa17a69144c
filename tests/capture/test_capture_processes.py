"""Capture across processes: two ranks at once, and a writer killed in the middle of a file."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests._dist import run_distributed
from tests.capture._fake_model import CAPTURES_PER_LAYER
from tests.capture._workers import capture_on_rank

REPO = Path(__file__).resolve().parents[2]


def test_two_ranks_capture_concurrently_without_collisions(tmp_path):
    results = run_distributed(capture_on_rank, 2, str(tmp_path))
    on_disk = sorted(p.name for p in Path(tmp_path, "bf16").glob("*.pt"))
    listed = sorted(e["file"] for r in results for e in r["entries"])
    assert listed == on_disk and len(on_disk) == 2 * 2 * CAPTURES_PER_LAYER  # 2 ranks x 2 micro-batches
    for rank, result in enumerate(results):
        for entry in result["entries"]:
            meta = entry["metadata"]
            assert (meta["rank"], meta["tp_rank"], meta["pp_rank"], meta["dp_rank"]) == (rank, rank, 0, 0)
            assert f"_rank{rank:02d}_" in entry["file"]
            assert torch.load(Path(tmp_path, "bf16", entry["file"]), weights_only=True)["metadata"] == meta


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed meanwhile
        return 0


def test_writer_killed_mid_write_leaves_only_loadable_files(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "tests.capture._workers", str(tmp_path)], cwd=REPO, env=env)
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
    entries = [json.loads(line) for line in Path(directory, "manifest-rank00.jsonl").read_text().splitlines()]
    assert {e["file"] for e in entries} <= {p.name for p in finals}
