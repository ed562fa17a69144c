"""Taking a captured operand off the compute stream: its statistics and a host copy.

CUDA: the statistics are packed on the device and copied to pinned host memory with the
tensor (full mode), all without a host sync; events mark the copies done and the writer
thread unpacks the statistics. CPU: the statistics are computed at once (a background
thread would only contend with training for the same cores and the GIL) and the tensor is
copied. Either way the writer calls ``finish_stats`` for the dict.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import Tensor

from megatron.quant.capture.site import Operand
from megatron.quant.stats import capture_stats, kernel_stats_serve, pack_stats, stats_from_packed

if TYPE_CHECKING:
    from megatron.quant.capture.extras import OperandExtras

StatsResult = tuple[Callable[[], dict], tuple[Any, ...]]  # (finish_stats, CUDA events to wait for)


@dataclass
class Snapshot:
    tensor: Tensor | None  # host copy to save, or None (statistics only)
    finish_stats: Callable[[], dict]  # run by the writer once every event in `copied` completed
    nbytes: int  # host memory held until written
    copied: tuple[Any, ...] = ()  # torch.cuda.Event per device-to-host copy


class StatsMemo:
    """Statistics of parameters, computed once per iteration.

    The layers capture a weight in every micro-batch, forward and backward, unchanged in
    between. The key holds each tensor's identity and autograd version (in-place updates bump
    it); entries keep those tensors alive, so no identity is reused while the memo lives. The
    session starts a new memo every iteration, which also covers writes through ``.data``.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, StatsResult]] = {}

    def stats(self, operand: Operand, compute: Callable[[Operand], StatsResult], extra_key: tuple = ()) -> StatsResult:
        x = operand.tensor
        if not (x.is_leaf and x.requires_grad):  # activations and gradients differ every call
            return compute(operand)
        parts = (x, operand.fmt, operand.quantized, operand.amax, operand.scale)
        key = (operand.axis, *((id(p), getattr(p, "_version", None)) for p in parts), extra_key)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = (parts, compute(operand))
        return entry[1]


def _pinned_copy(x: Tensor) -> Tensor:
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    return host


def _recorded_event() -> Any:
    event = torch.cuda.Event()
    event.record()
    return event


def with_extras(operand: Operand, level: str, extras: Optional["OperandExtras"]) -> StatsResult:
    """``operand_stats`` with what ``extras`` adds (``capture.extras``: per-block, what-if and TE's extra
    fields; computed at once, as the CPU path's statistics are)."""
    finish, copied = operand_stats(operand, level)
    if extras is None:
        return finish, copied
    added = extras.compute(operand)
    return (lambda: {**finish(), **added}), copied


def operand_stats(operand: Operand, level: str = "full") -> StatsResult:
    """``capture_stats`` at ``level``: tensor_stats, plus quant_stats when the operand has a
    format. On CUDA, the statistics a quantization kernel took in its pass, and the full statistics
    packed on the device, reach the host without a sync; otherwise the cheaper levels read their
    counts once per capture (they exist for runs where the statistics, not the transfer, are the
    cost)."""
    x, fmt = operand.tensor.detach(), operand.fmt
    if x.is_cuda and kernel_stats_serve(operand.kernel_stats, fmt, level):
        packed = operand.kernel_stats
    elif x.is_cuda and level == "full":
        packed = pack_stats(x, fmt, operand.axis, operand.amax, operand.quantized, operand.scale)
    else:
        stats = capture_stats(x, fmt, operand.axis, operand.amax, operand.quantized, operand.scale, level,
                              operand.kernel_stats)
        return (lambda: stats), ()
    host = _pinned_copy(packed)
    return (lambda: stats_from_packed(host.tolist(), x.shape, x.dtype, fmt, level)), (_recorded_event(),)


def _host_copy(x: Tensor) -> tuple[Tensor, tuple[Any, ...]]:
    """A private, compact host copy: later in-place updates (gradient accumulation, optimizer
    steps) cannot reach it, and a view does not drag its whole storage into the file."""
    x = x.detach()
    if x.is_cuda:
        return _pinned_copy(x), (_recorded_event(),)
    return x.clone(memory_format=torch.contiguous_format), ()


def take_snapshot(operand: Operand, keep_tensor: bool, memo: StatsMemo, level: str = "full",
                  extras: Optional["OperandExtras"] = None) -> Snapshot:
    """What the writer needs from ``operand``: statistics at ``level`` (with ``extras``') always, the
    tensor if ``keep_tensor``."""
    finish_stats, stats_copied = memo.stats(operand, functools.partial(with_extras, level=level, extras=extras),
                                            () if extras is None else extras.key())
    if not keep_tensor:
        return Snapshot(None, finish_stats, 0, stats_copied)
    tensor, tensor_copied = _host_copy(operand.tensor)
    return Snapshot(tensor, finish_stats, tensor.numel() * tensor.element_size(), stats_copied + tensor_copied)
