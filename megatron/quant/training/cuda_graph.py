"""``--cuda-graph``: a training iteration's forward-backward captured once as a CUDA graph and replayed.

Small models are launch-bound: their step is mostly the host launching kernels one after another. A
graph launches the whole forward-backward at once. ``GraphedStep`` runs the loop's forward-backward
(all micro-batches, the gradient reduction included) over static input buffers: each iteration's
micro-batches are copied into them, the first ``WARMUP_STEPS`` iterations run eagerly (on a side
stream, as torch's whole-network capture asks), the next one is captured and every later one replays
the capture. The optimizer's step, the learning-rate schedule, logging, evaluation and checkpoints
stay outside the graph, eager as without it. On the CPU there is no graph: every iteration runs the
same path eagerly over the static buffers.

What the graph keeps correct (checked on the CPU by ``layers.graph_safety`` over each preset's step,
tests/training/test_cuda_graph.py): the quantization's scales and amaxes are computed on the device;
delayed scaling's amax histories are device buffers updated in place, so they advance at each replay;
the quantized-weight cache is emptied after each optimizer step and before the capture, so the graph
quantizes the weights (once per step) itself. What it cannot keep correct is refused before the run
starts (``refusal``), one line naming why.

megatron-core's own graphs are not used: its per-layer graphs (``cuda_graph_impl="local"``) need its
graph-safe RNG tracker and still launch layer by layer, and its full-iteration wrapper
(``full_cuda_graph.FullCudaGraphWrapper``) registers the tracker's states with the graph (which needs
that tracker too: the trainer's keeps saved states, not generators) and keeps its graphs and buffers
in class attributes, one set per process.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from megatron.quant.formats.rounding import is_stochastic
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.presets import emulates_precision
from megatron.quant.training.run_tree import RunTree

WARMUP_STEPS = 3  # eager iterations before the capture (megatron-core's cuda_graph_warmup_steps default)

Step = Callable[[list], list]  # the micro-batches (dicts of tensors) -> the step's outputs


def add_cuda_graph_argument(group: Any) -> None:
    """The ``--cuda-graph`` flag, into ``group`` (an argparse parser or argument group)."""
    group.add_argument("--cuda-graph", action="store_true",
                       help="capture each iteration's forward-backward once as a CUDA graph and replay it (small "
                            "models are launch-bound); refused, with the reason, where a graph cannot keep the run "
                            "correct")


def refusal(tree: RunTree, precision: PrecisionConfig, capturing: bool) -> Optional[str]:
    """Why ``--cuda-graph`` cannot keep this run correct (one line), or None when it can (or is off)."""
    if not tree.schedule.cuda_graph:
        return None
    num_layers = tree.model.num_layers
    reasons = (
        (any(is_stochastic(fmt.rounding) for fmt in precision.formats(num_layers)),
         "stochastic rounding: its noise key is a host integer derived from the iteration and micro-batch, which "
         "a graph freezes at the captured step's (every replay would draw the same noise); use a round-to-nearest "
         "recipe (te-nvfp4-no-sr for te-nvfp4) or drop --cuda-graph"),
        (capturing, "capture (TENSOR_SAVE_ENABLED, --tensor-inspect-config): it reads tensors back and writes "
                    "files on the host, which a replay does not run; capture without --cuda-graph"),
        (bool(precision.schedules()), "a scheduled recipe: its precision changes at an iteration the graph does "
                                      "not see (it keeps the captured step's); drop --cuda-graph"),
        (tree.parallel.recompute_granularity is not None,
         f"--recompute-granularity {tree.parallel.recompute_granularity}: megatron-core's recompute saves and "
         "restores the device's random state on the host; drop one of them"),
        (tree.parallel.pipeline_model_parallel_size > 1,
         f"--pipeline-model-parallel-size {tree.parallel.pipeline_model_parallel_size}: the pipeline schedule's "
         "sends and receives are not captured; use 1"),
        (bool(tree.moe.num_experts), f"--num-experts {tree.moe.num_experts}: the token dispatch has shapes that "
                                     "depend on the routing (a host synchronisation); train the dense model"),
        (tree.model.attention_dropout > 0,
         f"--attention-dropout {tree.model.attention_dropout}: megatron-core's random-state tracker swaps the "
         "generator's state on the host around it; use --attention-dropout 0 (Llama's)"),
        (tree.precision.fp16, "--fp16: megatron-core's dynamic loss scaler makes a new scale tensor when the "
                              "scale changes, while a graph keeps reading the captured one; use --bf16"),
        (tree.precision.fp8_format is not None and not emulates_precision(tree.precision),
         f"--fp8-format {tree.precision.fp8_format} without --fp8-recipe: Transformer Engine's real FP8 keeps its "
         "scaling state on the host; emulate it (--fp8-recipe) or drop --cuda-graph"),
    )
    return next((f"--cuda-graph cannot keep {why}" for refused, why in reasons if refused), None)


def phase(call: int, warmup: int, cuda: bool) -> str:
    """What iteration ``call`` (1-based) of a ``GraphedStep`` does: "eager" (the CPU: no graph), "warm-up",
    "capture" (then its first replay) or "replay"."""
    if not cuda:
        return "eager"
    return "warm-up" if call <= warmup else "capture" if call == warmup + 1 else "replay"


class GraphedStep:
    """The forward-backward ``step`` as a CUDA graph (``cuda``), or eagerly over the same static
    buffers (the CPU); ``before_capture`` runs just before the capture (the weight cache's reset)."""

    def __init__(self, step: Step, cuda: bool, before_capture: Callable[[], None] = lambda: None,
                 warmup: int = WARMUP_STEPS) -> None:
        self.step, self.cuda, self.before_capture, self.warmup = step, cuda, before_capture, warmup
        self.inputs: Optional[list[dict]] = None  # the static micro-batch buffers
        self.outputs: Optional[list] = None  # the captured step's outputs: each replay rewrites them
        self.graph: Optional["torch.cuda.CUDAGraph"] = None
        self.calls = 0

    def __call__(self, batches: Iterable[dict]) -> list:
        self._load(list(batches))  # reading and copying the micro-batches: the host's work, before the graph
        self.calls += 1
        now = phase(self.calls, self.warmup, self.cuda)
        if now == "replay":
            self.graph.replay()
            return self.outputs
        if now == "eager":
            return self.step(self.inputs)
        if now == "warm-up":
            return self._on_side_stream()
        self.before_capture()
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.outputs = self.step(self.inputs)
        self.graph.replay()  # the capture ran nothing: this iteration's work is its first replay
        return self.outputs

    def _load(self, batches: list[dict]) -> None:
        if self.inputs is None:
            self.inputs = [{key: value.clone() for key, value in batch.items()} for batch in batches]
            return
        shapes = [{key: tuple(value.shape) for key, value in batch.items()} for batch in batches]
        expected = [{key: tuple(value.shape) for key, value in batch.items()} for batch in self.inputs]
        if shapes != expected:
            raise ValueError(f"--cuda-graph: this iteration's micro-batches have shapes {shapes}, the graph's "
                             f"{expected}; a graph replays fixed shapes")
        for static, batch in zip(self.inputs, batches):
            for key, value in batch.items():
                static[key].copy_(value, non_blocking=True)

    def _on_side_stream(self) -> list:
        """An eager warm-up on a side stream (torch's recipe for a whole-network capture)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            outputs = self.step(self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        return outputs
