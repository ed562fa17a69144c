"""Delayed scaling's history update as one Triton launch (``layers.delayed.updated_history``, Transformer
Engine's ``kernel_bulk``): a tensor's amax enters an operand's amax history and the amax its next scale
derives from is chosen, on the device, with no host sync. The kernel writes new tensors (its one
program's threads would race on the history's own entries); ``AmaxHistory.record`` copies them into its
buffers, whose addresses a CUDA graph keeps. A maximum
and a copy do not depend on any order: the result is the torch path's bit for bit."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .elementwise import load
from .launch import launch_options

BLOCK = 1024  # history entries a step of the program's loop takes


@triton.jit
def _history_kernel(amax_ptr, history_ptr, for_scale_ptr, new_history_ptr, new_for_scale_ptr, length,
                    MOST_RECENT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """One program: the history (oldest first) with the amax at amax_ptr appended and its oldest entry
    dropped, unless that amax is 0; the next scale's amax: the newest (``MOST_RECENT``) or the window's
    largest, NaN skipped (CUDA's fmaxf from 0), where finite and > 0 and rolled, else the old one."""
    amax = load(amax_ptr, True)
    rolled = amax != 0.0  # NaN rolls too
    top = tl.zeros((BLOCK_SIZE,), tl.float32)
    for start in range(0, length, BLOCK_SIZE):
        i = start + tl.arange(0, BLOCK_SIZE)
        old = tl.load(history_ptr + i, mask=i < length, other=0.0)
        shifted = tl.where(i == length - 1, amax, tl.load(history_ptr + i + 1, mask=i + 1 < length, other=0.0))
        window = tl.where(rolled, shifted, old)
        tl.store(new_history_ptr + i, window, mask=i < length)
        top = tl.maximum(top, tl.where((window != window) | (i >= length), 0.0, window))
    if MOST_RECENT:
        chosen = amax
    else:
        chosen = tl.max(top, axis=0)
    usable = rolled & (chosen > 0.0) & (chosen != float("inf"))  # NaN fails the comparison
    tl.store(new_for_scale_ptr, tl.where(usable, chosen, tl.load(for_scale_ptr)))


def updated_history(history: Tensor, amax_for_scale: Tensor, amax: Tensor, algo: str) -> tuple[Tensor, Tensor]:
    """``layers.delayed.updated_history`` in one launch: (the new history, the amax the next scale
    derives from), new float32 tensors on the history's device. ``amax``: 0-d, float32, bf16 or fp16."""
    new_history, new_for_scale = torch.empty_like(history), torch.empty_like(amax_for_scale)
    _history_kernel[(1,)](amax, history, amax_for_scale, new_history, new_for_scale, history.numel(),
                          MOST_RECENT=algo == "most_recent", BLOCK_SIZE=BLOCK, **launch_options(BLOCK))
    return new_history, new_for_scale
