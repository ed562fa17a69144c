"""``--cuda-graph`` on a GPU (``pytest --device cuda -m device``): a llama-tiny run whose forward-backward is
captured after its warm-up and replayed trains as the eager run does, delayed scaling's amax histories
advancing through the replays. The CPU path (no graph) is tests/training/test_cuda_graph.py's."""
import pytest
import torch

from megatron.quant.training.cuda_graph import WARMUP_STEPS, GraphedStep

pytestmark = pytest.mark.device

ITERS = WARMUP_STEPS + 3  # the warm-up, the captured iteration and two replays
ARGV = ["--model", "llama-tiny", "--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", str(ITERS), "--lr", "3e-3", "--lr-warmup-iters", "0", "--eval-iters", "0", "--bf16",
        "--log-interval", "1", "--seed", "3", "--fp8-format", "hybrid", "--fp8-recipe", "delayed",
        "--fp8-amax-history-len", "3"]


def _train(argv):
    """(losses, forward weights' amax histories, the step runner) of a run through the loop."""
    from megatron.quant.training import loop
    from megatron.quant.training.main import check_inputs, setup, teardown

    run, logger = setup(check_inputs(argv))
    try:
        history = loop.train(run, logger)
        histories = {name: buffer.clone() for name, buffer in run.gpt.named_buffers()
                     if "fprop_weight" in name and name.endswith("amax_history")}
    finally:
        logger.close()
        teardown(True)
    return torch.tensor([row["lm loss"] for row in history]), histories, run.step_runner


def test_a_replayed_graph_trains_as_the_eager_run(device, monkeypatch):
    if device.type != "cuda":
        pytest.skip("a CUDA graph needs --device cuda; the CPU's path is tests/training/test_cuda_graph.py's")
    for name in ("CUSTOM_QUANT_TYPE", "TENSOR_SAVE_ENABLED"):
        monkeypatch.delenv(name, raising=False)
    eager_losses, eager, _ = _train(ARGV)
    losses, histories, runner = _train([*ARGV, "--cuda-graph"])
    assert isinstance(runner, GraphedStep) and runner.graph is not None and runner.calls == ITERS
    assert torch.allclose(losses, eager_losses, rtol=1e-2), (losses, eager_losses)
    assert histories.keys() == eager.keys() and histories
    for name, history in histories.items():  # the newest entries come from the replays
        assert bool((history > 0).all()) and torch.allclose(history, eager[name], rtol=1e-2), name
