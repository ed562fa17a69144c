"""A short llama-tiny run on the test device through the real entry point: megatron-core's
schedule and optimizer on a GPU, the CPU loop elsewhere; full-mode capture of one iteration
copies device tensors to loadable files."""
import json

import pytest
import torch

from megatron.quant.training import main as training_main

pytestmark = pytest.mark.device


def test_tiny_run_with_capture_on_device(device, tmp_path, monkeypatch):
    monkeypatch.setenv("CUSTOM_QUANT_TYPE", "mxfp8")
    monkeypatch.setenv("TENSOR_SAVE_ENABLED", "1")
    monkeypatch.setenv("TENSOR_SAVE_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("TENSOR_SAVER_ITERATION", "1")
    history = training_main.main(["--model", "llama-tiny", "--mock-data", "--micro-batch-size", "2",
                          "--global-batch-size", "4", "--train-iters", "3", "--lr", "3e-3",
                          "--lr-warmup-iters", "0", "--eval-iters", "0", "--log-interval", "1", "--seed", "3"])
    losses = [h["lm loss"] for h in history]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    [manifest] = (tmp_path / "logs" / "mxfp8").glob("manifest-rank*.jsonl")
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert {r["metadata"]["iteration"] for r in records} == {1}
    files = sorted(manifest.parent.glob("*.pt"))
    assert len(files) == len(records) > 0
    saved = torch.load(files[0], weights_only=True)
    assert saved["tensor"].device.type == "cpu" and saved["tensor"].isfinite().all()
