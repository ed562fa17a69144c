"""Activation recompute (megatron-core's ``recompute_granularity`` full / selective) that changes no bit.

megatron-core recomputes through ``tensor_parallel.checkpoint(function, ...)``: its
``CheckpointFunction`` calls ``function`` once in the forward (under no_grad) and once more in the
backward (under enable_grad), restoring the RNG states in between. That second call is the one
place that knows "this forward is a recompute", and of which forward, so ``checkpoint`` below
wraps ``function`` there, per checkpointed region:

- first call: the run position is remembered, and the scale each delayed-scaled operand is
  quantized with is kept (in order) while its history records the amax, as usual;
- second call, the recompute: ``tensor_saver.recomputing`` restores that position (stochastic
  rounding draws the same noise, whatever micro-batch a pipeline schedule is at) and drops the
  forward's capture records, and delayed-scaled operands take the kept scales and record
  nothing (TE's recompute bookkeeping: ``copy_forward_fp8_meta_tensors_for_recompute`` /
  ``get_old_fp8_meta_tensors_for_recompute``).

Detecting the backward phase instead (a forward running inside the autograd engine) would say
"recompute" but not which micro-batch; a per-module queue (TE's) assumes the schedule's order.
The wrapper ties the state to the region itself. ``install`` puts it in place of
``megatron.core.tensor_parallel.checkpoint``, the name megatron-core's transformer block,
attention and MLP call at run time (``te_checkpoint`` is used only with real TE FP8, which runs
no emulated layers).
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.recipes.delayed import AmaxHistory


class _Region:
    """One checkpointed call: its position and the delayed scales its first forward used."""

    def __init__(self, function: Callable[..., Any]):
        self.function, self.calls = function, 0
        self.position = tensor_saver.position()
        self.scale_amaxes: deque[Tensor] = deque()
        self.replaying = False
        self.outer: Optional[_Region] = None

    def __call__(self, *args: Any) -> Any:
        global _region
        self.calls += 1
        self.replaying = self.calls > 1
        self.outer, _region = _region, self
        outer = self.outer
        try:
            if not self.replaying:
                return self.function(*args)
            with tensor_saver.recomputing(self.position):
                return self.function(*args)
        finally:
            _region = outer


_region: Optional[_Region] = None  # the checkpointed region whose forward is running


def delayed_scale_amax(history: AmaxHistory, device: Any) -> tuple[Tensor, Optional[Callable[[Tensor], None]]]:
    """(the amax a delayed-scaled operand is quantized with, what records the operand's own amax in
    ``history`` once it is known: None in a recompute, which takes the scale its first forward used
    and records nothing)."""
    return _scale_amax(_region, history, device)


def _scale_amax(region: Optional[_Region], history: AmaxHistory, device: Any
                ) -> tuple[Tensor, Optional[Callable[[Tensor], None]]]:
    if region is None:
        return history.scale_amax(device), history.record
    if region.replaying:
        return region.scale_amaxes.popleft(), None
    # A first forward; inside an enclosing recompute (nested checkpoints) that one's kept scale.
    amax, record = _scale_amax(region.outer, history, device)
    region.scale_amaxes.append(amax)
    return amax, record


def checkpoint(function: Callable[..., Any], distribute_saved_activations: bool, *args: Any) -> Any:
    """megatron-core's ``tensor_parallel.checkpoint`` with ``function`` run as a ``_Region``."""
    return _megatron_checkpoint(_Region(function), distribute_saved_activations, *args)


def _megatron_checkpoint(function: Callable[..., Any], distribute_saved_activations: bool, *args: Any) -> Any:
    from megatron.core.tensor_parallel.random import checkpoint as megatron_checkpoint

    return megatron_checkpoint(function, distribute_saved_activations, *args)


def install() -> None:
    """Route megatron-core's recompute through ``checkpoint`` (idempotent; needed only when a
    model recomputes: elsewhere ``tensor_parallel.checkpoint`` is never called)."""
    from megatron.core import tensor_parallel

    tensor_parallel.checkpoint = checkpoint
