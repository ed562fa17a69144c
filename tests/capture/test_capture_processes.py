"""Capture across processes: two ranks at once (faults: tests/reliability/test_capture_faults.py)."""
from pathlib import Path

import torch

from tests._dist import run_distributed
from tests.capture._fake_model import CAPTURES_PER_LAYER
from tests.capture._workers import capture_on_rank


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
