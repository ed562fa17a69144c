"""No host synchronisation inside a training step: every read of a tensor's value by the host
(``.item()``, ``.tolist()``, ``bool(t)``, ...) made by megatron code (ours or megatron-core's) during a
tiny run happens at a read-back point of the loop (training/loop.py), never inside a step; with
capture on, the capture code reads on the captured iteration, and only there.

torch's own internals are not counted: they read host-resident bookkeeping (e.g. AdamW's step
counters), which on a GPU stays on the host too; nor is the capture writer's thread, which reads
host copies."""
import sys
import threading
from collections import Counter

import pytest
import torch

from megatron.quant.training import loop

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
ITERS, LOG_INTERVAL = 6, 3
CAPTURED = 1  # 0-based: the step whose capture may read (iteration 2: TENSOR_SAVER_ITERATION=2)
CAPTURE_CODE = ("/megatron/quant/capture/", "/megatron/quant/stats/", "/megatron/quant/tensor_saver.py")


@pytest.mark.parametrize("capture", [False, True])
def test_training_steps_read_nothing_back_outside_logging_iterations(monkeypatch, tmp_path, capture):
    from megatron.quant.training.main import main

    state = {"iteration": 0, "in_step": False}  # iteration: the last one completed (1-based)
    reads: Counter = Counter()

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            ours = "megatron" in caller.split("site-packages")[-1] or "/megatron/quant/" in caller
            if ours and threading.current_thread() is threading.main_thread():
                reads[("step" if state["in_step"] else "loop", state["iteration"], name, caller)] += 1
            return original(self, *args, **kwargs)
        return read

    step = loop.train_step

    def train_step(run, iteration):
        state["in_step"] = True
        try:
            return step(run, iteration)
        finally:
            state["in_step"], state["iteration"] = False, iteration + 1

    monkeypatch.setattr(loop, "train_step", train_step)
    if capture:  # statistics of the qkv layers' operands at one iteration
        for key, value in {"TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_DIR": str(tmp_path), "TENSOR_SAVE_MODE": "stats",
                           "TENSOR_SAVER_ITERATION": str(CAPTURED + 1), "TENSOR_SAVE_ROLES": "qkv"}.items():
            monkeypatch.setenv(key, value)
    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    history = main(["--model", "llama-tiny", "--mock-data", "--seq-length", "32", "--micro-batch-size", "1",
                    "--global-batch-size", "2", "--train-iters", str(ITERS), "--log-interval", str(LOG_INTERVAL),
                    "--eval-iters", "0", "--lr", "1e-3", "--seed", "1"])
    monkeypatch.undo()
    assert [row["iteration"] for row in history] == list(range(1, ITERS + 1))
    assert all(isinstance(row["lm loss"], float) and isinstance(row["grad norm"], float) for row in history)

    def capturing(key) -> bool:  # the capture code reading on its own iteration
        where, iteration, _, caller = key
        return capture and any(part in caller for part in CAPTURE_CODE) and iteration == CAPTURED + (where == "loop")

    inside = {key: n for key, n in reads.items() if key[0] == "step" and not capturing(key)}
    assert not inside, f"host reads inside training steps: {inside}"
    between = {key: n for key, n in reads.items()
               if 0 < key[1] < ITERS and key[1] % LOG_INTERVAL and not capturing(key)}
    assert not between, f"host reads after a non-logging iteration: {between}"
    assert {key[1] for key in reads if key[1] and not capturing(key)} == {3, 6}  # the read-backs are seen
    if capture:
        assert any(capturing(key) for key in reads)  # the capture did read, on its iteration
