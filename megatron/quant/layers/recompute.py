"""Activation recompute (megatron-core's ``recompute_granularity`` full / selective) that changes no bit.

megatron-core recomputes through ``tensor_parallel.checkpoint(function, ...)``: its
``CheckpointFunction`` calls ``function`` once in the forward (under no_grad) and once more in the
backward (under enable_grad), restoring the RNG states in between. That second call is the one
place that knows "this forward is a recompute", and of which forward, so ``checkpoint`` below
runs ``function`` as a ``position.Region``:

- first call: the region keeps the run position, and the scale each delayed-scaled operand is
  quantized with (in order) while its history records the amax, as usual;
- second call, the recompute: ``position.current()`` is the kept position (stochastic rounding
  draws the same noise, whatever micro-batch a pipeline schedule is at), the saver drops the
  forward's records, and delayed-scaled operands take the kept scales and record nothing (TE's
  recompute bookkeeping: ``copy_forward_fp8_meta_tensors_for_recompute`` /
  ``get_old_fp8_meta_tensors_for_recompute``).

Detecting the backward phase instead (a forward running inside the autograd engine) would say
"recompute" but not which micro-batch; a per-module queue (TE's) assumes the schedule's order.
The region ties the state to the checkpointed call itself.

megatron-core's transformer block, attention and MLP look ``tensor_parallel.checkpoint`` up when
they call it; ``route_recompute(model)`` makes that name ``checkpoint`` only while ``model``'s
forward (or one of its recomputes) runs, and megatron-core's own function everywhere else, so
another model in the process recomputes as stock (``te_checkpoint`` is used only with real TE FP8,
which runs no emulated layers).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from megatron.quant import position
from megatron.quant.layers.delayed import AmaxHistory


class _Checkpointed:
    """``function`` as megatron-core's CheckpointFunction runs it: a first call, then its recompute."""

    def __init__(self, function: Callable[..., Any]):
        self.function, self.calls = function, 0
        self.region = position.Region(position.current())

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        self.region.replaying = self.calls > 1
        with position.within(self.region):
            if not self.region.replaying:
                return self.function(*args)
            with _routed():  # a checkpoint nested in the recomputed forward is a region too
                return self.function(*args)


def delayed_scale_amax(history: AmaxHistory, device: Any) -> tuple[Tensor, Optional[Callable[[Tensor], None]]]:
    """(the amax a delayed-scaled operand is quantized with, what records the operand's own amax in
    ``history`` once it is known: None in a recompute, which takes the scale its first forward used
    and records nothing)."""
    return _scale_amax(position.region(), history, device)


def _scale_amax(region: Optional[position.Region], history: AmaxHistory, device: Any
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
    """megatron-core's ``tensor_parallel.checkpoint`` with ``function`` run as a recompute region."""
    from megatron.core.tensor_parallel.random import checkpoint as megatron_checkpoint

    return megatron_checkpoint(_Checkpointed(function), distribute_saved_activations, *args)


@contextlib.contextmanager
def _routed() -> Iterator[None]:
    """megatron-core's recompute calls go through ``checkpoint`` inside the block."""
    from megatron.core import tensor_parallel

    replaced = tensor_parallel.checkpoint
    tensor_parallel.checkpoint = checkpoint
    try:
        yield
    finally:
        tensor_parallel.checkpoint = replaced


class _Routing:
    """A model's forward hooks: ``_routed`` from the forward's start to its end (an error included)."""

    def __init__(self) -> None:
        self.open: list[contextlib.AbstractContextManager] = []  # one per forward running (re-entrant)

    def enter(self, module: torch.nn.Module, args: Any) -> None:
        routed = _routed()
        routed.__enter__()
        self.open.append(routed)

    def leave(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.open.pop().__exit__(None, None, None)


def route_recompute(model: torch.nn.Module) -> None:
    """Recompute ``model``'s checkpointed regions through ``checkpoint`` (needed only when it
    recomputes: elsewhere megatron-core never calls ``tensor_parallel.checkpoint``)."""
    routing = _Routing()
    model.register_forward_pre_hook(routing.enter)
    model.register_forward_hook(routing.leave, always_call=True)
