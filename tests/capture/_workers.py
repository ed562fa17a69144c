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


class _StallingDisk:
    """A file object that writes its first ``budget`` bytes and then hangs, like a dying disk."""

    def __init__(self, handle, budget: int):
        self._handle, self._budget = handle, budget

    def write(self, data) -> int:
        if len(data) > self._budget:
            self._handle.write(bytes(memoryview(data)[:self._budget]))
            self._handle.flush()
            time.sleep(3600)  # the parent kills the process here, mid-file
        self._budget -= len(data)
        self._handle.write(data)
        return len(data)

    def flush(self) -> None:
        self._handle.flush()


def capture_until_killed(save_dir: str) -> None:
    """Capture 4 MB tensors; the first file completes, the second hangs halfway until killed."""
    real_save = torch.save
    saves = []

    def stalling_save(obj, path):
        saves.append(path)
        with open(path, "wb") as handle:
            real_save(obj, _StallingDisk(handle, budget=2**40 if len(saves) == 1 else 2**21))

    torch.save = stalling_save
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=save_dir, iterations="every:1"))
    site = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", "bf16")
    for iteration in range(2):
        tensor_saver.set_iteration(iteration)
        tensor_saver.capture(site, "forward", "pre", {"input": torch.full((2**20,), float(iteration))})
    tensor_saver.flush()


if __name__ == "__main__":
    capture_until_killed(sys.argv[1])
