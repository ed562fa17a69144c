"""Functions run in other processes by the capture tests (they must be importable)."""
from __future__ import annotations

import json
from pathlib import Path

from megatron.quant import tensor_saver
from megatron.quant.tensor_saver import SaverConfig
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
