"""Taking a captured operand off the compute stream: host copies plus its statistics.

CUDA: the statistics are packed on the device and copied to pinned host memory with the
tensor (full mode), all without a host sync; an event marks the copies done and the writer
thread unpacks them. CPU: the statistics are computed at once (a background thread would
only contend with training for the same cores and the GIL) and the tensor is copied.
Either way the writer calls ``finish_stats`` to get the dict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from megatron.quant.capture.site import Operand
from megatron.quant.stats import (pack_quant_stats, pack_tensor_stats, quant_stats, tensor_stats,
                                  unpack_quant_stats, unpack_tensor_stats)


@dataclass
class Snapshot:
    tensor: Optional[Tensor]  # host copy to save, or None (statistics only)
    finish_stats: Callable[[], dict]  # run by the writer once `copied` has completed
    nbytes: int  # host memory held until written
    copied: Optional[Any] = None  # torch.cuda.Event recorded after the device-to-host copies


def _private_copy(x: Tensor) -> Tensor:
    # Compact, so a view does not drag its whole storage along; private, so later in-place
    # updates (gradient accumulation, optimizer steps) cannot change what is saved.
    return x.detach().clone(memory_format=torch.contiguous_format)


def _pinned_copy(x: Tensor) -> Tensor:
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    return host


def take_snapshot(operand: Operand, keep_tensor: bool) -> Snapshot:
    """What the writer needs from ``operand``: statistics always, the tensor if ``keep_tensor``."""
    x = operand.tensor.detach()
    fmt = operand.fmt
    if x.is_cuda:
        packed = [pack_tensor_stats(x)]
        if fmt is not None:
            packed.append(pack_quant_stats(x, fmt, operand.axis, operand.amax, operand.quantized))
        host_packed = [_pinned_copy(p) for p in packed]
        host_x = _pinned_copy(x) if keep_tensor else None
        copied = torch.cuda.Event()
        copied.record()

        def finish_stats() -> dict:
            stats = unpack_tensor_stats(host_packed[0].tolist(), x.shape, x.dtype)
            if fmt is not None:
                stats.update(unpack_quant_stats(host_packed[1].tolist(), x.numel()))
            return stats

        nbytes = 0 if host_x is None else host_x.numel() * host_x.element_size()
        return Snapshot(host_x, finish_stats, nbytes, copied)

    stats = tensor_stats(x)
    if fmt is not None:
        stats.update(quant_stats(x, fmt, operand.axis, operand.amax, operand.quantized))
    host_x = _private_copy(x) if keep_tensor else None
    return Snapshot(host_x, lambda: stats, 0 if host_x is None else host_x.numel() * host_x.element_size())
