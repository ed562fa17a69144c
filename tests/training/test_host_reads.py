"""No host synchronisation inside a training step: every read of a tensor's value by the host
(``.item()``, ``.tolist()``, ``bool(t)``, ...) made by megatron code (ours or megatron-core's) during a
tiny run happens at a read-back point of the loop (training/loop.py), never inside a step.

torch's own internals are not counted: they read host-resident bookkeeping (e.g. AdamW's step
counters), which on a GPU stays on the host too."""
import sys
from collections import Counter

import torch

from megatron.quant.training import loop

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
ITERS, LOG_INTERVAL = 6, 3


def test_training_steps_read_nothing_back_outside_logging_iterations(monkeypatch):
    from megatron.quant.training.main import main

    state = {"iteration": 0, "in_step": False}  # iteration: the last one completed (1-based)
    reads: Counter = Counter()

    def counted(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if "megatron" in caller.split("site-packages")[-1] or "/megatron/quant/" in caller:
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
    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    history = main(["--model", "llama-tiny", "--mock-data", "--seq-length", "32", "--micro-batch-size", "1",
                    "--global-batch-size", "2", "--train-iters", str(ITERS), "--log-interval", str(LOG_INTERVAL),
                    "--eval-iters", "0", "--lr", "1e-3", "--seed", "1"])
    monkeypatch.undo()
    assert [row["iteration"] for row in history] == list(range(1, ITERS + 1))
    assert all(isinstance(row["lm loss"], float) and isinstance(row["grad norm"], float) for row in history)
    inside = {key: n for key, n in reads.items() if key[0] == "step"}
    assert not inside, f"host reads inside training steps: {inside}"
    between = {key: n for key, n in reads.items() if 0 < key[1] < ITERS and key[1] % LOG_INTERVAL}
    assert not between, f"host reads after a non-logging iteration: {between}"
    assert {key[1] for key in reads if key[1]} == {3, 6}  # the read-backs themselves are seen
