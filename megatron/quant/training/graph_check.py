"""Is a run's step safe to capture as a CUDA graph? Checked on the CPU, over the real model and recipe.

``check_training_steps(argv)`` sets the run ``argv`` describes up as the trainer does and runs a few
iterations through ``--cuda-graph``'s own path (``cuda_graph.GraphedStep``: static input buffers, the
optimizer outside), each iteration's forward-backward (what a graph captures: the GPU's, through
megatron-core's schedule, its ``cuda`` tensors made on the CPU) but the first (which fills
megatron-core's caches, as a graph's warm-up does) under ``layers.graph_safety.GraphSafety``.
It reports each step's host synchronisations and data-dependent shapes, and what a graph captured on
one step would replay wrongly on the next (work, shapes, host values or input addresses that differ)::

    python -m megatron.quant.training.graph_check --model llama-tiny --mock-data --bf16 --train-iters 3

(``CUSTOM_QUANT_TYPE`` chooses the recipe, as for training). It exits 0 when the steps are safe to
graph, 1 with the findings listed. ``--cuda-graph`` itself is not needed: the check runs the flag's
path anyway.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch.distributed as dist

from megatron.quant import position, tensor_saver
from megatron.quant.layers.graph_safety import (
    CudaOnCpu,
    Finding,
    GraphSafety,
    StepRecord,
    replay_hazards_of,
    summary,
)
from megatron.quant.training import loop
from megatron.quant.training.arguments import ArgumentError
from megatron.quant.training.cuda_graph import GraphedStep
from megatron.quant.training.main import check_inputs, connect_schedule, setup, teardown


@dataclass(frozen=True)
class GraphCheck:
    """The steps' records and the replay hazards between them."""

    records: list[StepRecord]
    hazards: list[Finding]

    @property
    def safe(self) -> bool:
        return not self.hazards and not any(record.findings for record in self.records)

    def report(self) -> str:
        return summary(self.records, self.hazards)


def check_training_steps(argv: Optional[Sequence[str]], steps: int = 2) -> GraphCheck:
    """Run ``steps`` iterations of the run ``argv`` (None: the command line) describes, their forward-backward under
    ``GraphSafety``; ArgumentError for bad flags or fewer than 2 steps (a replay needs two to compare)."""
    if steps < 2:
        raise ArgumentError(f"the graph check compares consecutive steps: steps must be at least 2, got {steps}")
    inputs = check_inputs(None if argv is None else list(argv))
    if inputs.tree.schedule.train_iters < steps + 1:
        raise ArgumentError(f"--train-iters {inputs.tree.schedule.train_iters} is below the {steps} steps checked "
                            f"and the one before them")
    owns_process_group = not dist.is_initialized()
    records: list[StepRecord] = []

    def checked(batches: list) -> list:  # the first step fills megatron-core's caches: a graph captures later
        if position.current().iteration == run.start_iteration + 1:
            with CudaOnCpu():
                return loop.forward_backward_scheduled(run, batches)
        with CudaOnCpu(), GraphSafety() as mode:
            reports = loop.forward_backward_scheduled(run, batches)
        records.append(mode.record)
        return reports

    run, logger = setup(inputs)
    try:
        connect_schedule(run.gpt.config, run.model_chunks, None)  # the GPU's path: megatron-core's schedule
        run.step_runner = GraphedStep(checked, cuda=False)
        for iteration in range(run.start_iteration, run.start_iteration + 1 + steps):
            position.set_iteration(iteration + 1)
            loop.train_step(run, iteration)
    finally:
        logger.close()
        tensor_saver.close()
        teardown(owns_process_group)
    return GraphCheck(records, replay_hazards_of(records))


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        result = check_training_steps(argv)
    except (ArgumentError, ValueError, FileNotFoundError) as error:
        print(f"graph check: error: {error}", file=sys.stderr)
        return 2
    print(result.report())
    return 0 if result.safe else 1


if __name__ == "__main__":
    sys.exit(main())
