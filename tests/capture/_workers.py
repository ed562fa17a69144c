"""Functions run in other processes by the capture tests (they must be importable)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from megatron.quant import tensor_saver
from megatron.quant.tensor_saver import CaptureSite, SaverConfig
from tests.capture._fake_model import FakeModel, run_iteration


def capture_on_rank(rank: int, world_size: int, save_dir: str) -> dict:
    """One iteration captured on this rank of a TP=world_size group; returns what it wrote."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world_size)
    try:
        tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, iterations="0"))
        run_iteration(FakeModel(n_layers=1, seed=rank), 0)
        tensor_saver.close()
        lines = Path(save_dir, "bf16", f"manifest-rank{rank:02d}.jsonl").read_text().splitlines()
        return {"entries": [json.loads(line) for line in lines]}
    finally:
        parallel_state.destroy_model_parallel()


class _SlowDisk:
    """A file object that writes in small pieces with pauses, so a kill lands mid-file."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, data) -> int:
        view = memoryview(data)
        for start in range(0, len(view), 1 << 16):
            self._handle.write(view[start:start + (1 << 16)])
            self._handle.flush()
            time.sleep(0.002)
        return len(view)

    def flush(self) -> None:
        self._handle.flush()


def capture_until_killed(save_dir: str) -> None:
    """Capture ~4 MB tensors forever through a slow disk (the parent kills this process)."""
    real_save = torch.save

    def slow_save(obj, path):
        with open(path, "wb") as handle:
            real_save(obj, _SlowDisk(handle))

    torch.save = slow_save
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, iterations="every:1"))
    site = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", "bf16")
    for iteration in range(10**6):
        tensor_saver.set_iteration(iteration)
        tensor_saver.capture(site, "forward", "pre", {"input": torch.full((2**20,), float(iteration))})


if __name__ == "__main__":
    capture_until_killed(sys.argv[1])
