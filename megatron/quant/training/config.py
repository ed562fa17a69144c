"""What the training loop reads of a run's flags, typed: ``TrainingConfig``.

``main.setup`` builds it once from the run's configuration (``run_tree.RunTree``); the loop
(``loop.py``) reads only it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class TrainingConfig:
    """The loop's settings, checked by ``arguments.validate_args`` before they get here."""

    train_iters: int                # --train-iters: the loop runs iterations start..train_iters-1
    micro_batch_size: int           # --micro-batch-size: sequences per micro-batch per data-parallel rank
    global_batch_size: int          # --global-batch-size: sequences per optimizer step over all ranks
    num_microbatches: int           # global batch / (micro-batch x data-parallel size): passes per step
    seq_length: int                 # --seq-length: tokens per sequence
    log_interval: int               # --log-interval: print a line every this many iterations
    eval_interval: int              # --eval-interval: validate every this many iterations
    eval_iters: int                 # --eval-iters: global batches per validation; 0 = no validation
    save: Optional[str]             # --save: checkpoint directory; None = no checkpoints
    save_interval: Optional[int]    # --save-interval: checkpoint every this many iterations (and at the end)
    exit_interval: Optional[int]    # --exit-interval: stop after an iteration divisible by it
    divergence_threshold: Optional[float]  # --divergence-threshold: stop when the loss exceeds it (NaN/Inf always)
    wandb_project: Optional[str]    # --wandb-project: also log to this Weights & Biases project
    wandb_exp_name: Optional[str]   # --wandb-exp-name: the W&B run name (None: W&B's)
    wandb_save_dir: Optional[str]   # --wandb-save-dir: W&B's local directory (None: W&B's)
    cuda_graph: bool = False        # --cuda-graph: the forward-backward as a CUDA graph (training/cuda_graph.py)

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> "TrainingConfig":
        """The loop's settings from the run's checked flags (``run_tree.RunTree.flags``)."""
        return cls(**{name: flags[name] for name in cls.__dataclass_fields__})
