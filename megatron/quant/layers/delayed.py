"""Delayed scaling (Transformer Engine's ``DelayedScaling``): each operand's per-tensor scale comes
from an amax history kept across steps, not from the tensor being quantized.

Per quantization of an operand whose format has ``scaling="delayed"`` (TE's kernel
``amax_and_scale_update``, run at every fp8_autocast exit: once per micro-batch):

1. the tensor is quantized with the current scale, ``encode = target / amax_for_scale``;
2. its own amax (MAX-reduced over the amax reduction group) enters the history, which keeps
   the last ``amax_history_len`` amaxes;
3. the next ``amax_for_scale`` is that newest amax (``amax_compute_algo="most_recent"``) or the
   largest in the history (``"max"``, skipping NaN as CUDA's fmaxf does); an amax of 0, Inf or
   NaN keeps the previous scale.

An amax of 0 (an operand that was all zeros: an unused expert, a masked-out input, a zero
gradient) leaves the history as it is: TE PyTorch's default update is the fused ``kernel_bulk``
(``delayed_scaling.cu``, ``if (last_amax != 0.0f)`` around the roll, TE PR #825), so the window
keeps its oldest entry. (TE's unfused Python update, ``NVTE_UNFUSED_FP8_UPDATE=1``, rolls
anyway; it is not emulated.)

The history starts at zeros and the scale at 1 (``amax_for_scale`` Inf, which the format turns
into encode 1), so each operand's first quantization in a run is unscaled, as in TE. The state
keeps the amax a scale derives from rather than the scale: the format computes
``target / amax`` with TE's arithmetic either way, so the scales are TE's bit for bit, and a
kept scale is kept exactly.

The state lives in ``AmaxHistory`` modules registered on the layer (``amax_histories``, by
``layers.histories.attach_histories``), so it
is in the model's state dict and in checkpoints, and moves with the model between devices.
Weights are quantized once per optimizer step (the quantized-weight cache), so their history
gains one entry per step, as with TE's first-micro-batch weight caching. Where a quantized
copy is reused (the forward input for wgrad, one gradient for both backward GEMMs) the second
operand's history is not consulted: TE casts such a tensor once, too.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from megatron.quant.formats.interface import QuantFormat
from megatron.quant.kernels.dispatch import serves_history
from megatron.quant.kernels.dispatch import updated_history as on_device

DELAYED = "delayed"
HISTORIES = "amax_histories"  # the attribute holding a module's histories, and its state-dict prefix


def is_delayed(fmt: Optional[QuantFormat]) -> bool:
    """True for a format scaled from an amax history (``scaling="delayed"``)."""
    return fmt is not None and fmt.scaling == DELAYED


def updated_history(history: Tensor, amax_for_scale: Tensor, amax: Tensor, algo: str) -> tuple[Tensor, Tensor]:
    """(history with ``amax`` appended and its oldest entry dropped, the amax the next scale
    derives from), for a history oldest first; an ``amax`` of 0 changes neither; pure."""
    rolled = amax.reshape(()) != 0  # TE's kernel_bulk skips the roll and keeps the scale
    window = torch.where(rolled, torch.cat([history[1:], amax.reshape(1)]), history)
    if algo == "most_recent":
        chosen = amax.reshape(())
    else:  # fmaxf from 0: NaN entries are skipped, Inf is kept
        chosen = torch.nan_to_num(window, nan=0.0, posinf=math.inf).amax()
    usable = torch.isfinite(chosen) & (chosen > 0) & rolled
    return window, torch.where(usable, chosen, amax_for_scale)


class AmaxHistory(torch.nn.Module):
    """One operand's delayed-scaling state: ``amax_history`` (the last L amaxes, oldest first)
    and ``amax_for_scale``; ``group``: where recorded amaxes are MAX-reduced (None: nowhere)."""

    def __init__(self, length: int, algo: str, group: Optional[dist.ProcessGroup] = None):
        super().__init__()
        self.algo, self.group = algo, group
        self.register_buffer("amax_history", torch.zeros(length))
        self.register_buffer("amax_for_scale", torch.full((), math.inf))

    def scale_amax(self, device: torch.device) -> Tensor:
        """The amax the current scale derives from (a copy: recording writes the buffer in place)."""
        if self.amax_history.device != device:  # built on CPU, run elsewhere
            self.to(device)
        return self.amax_for_scale.clone()

    def record(self, amax: Tensor) -> None:
        """Append a tensor's amax (0-d; reduced over ``group`` first) and update the scale's amax: one
        launch of the history kernel where the kernels serve the history, else in torch. The results are
        copied into the buffers, which keep their addresses: a CUDA graph replays the step on them."""
        amax = amax.detach().reshape(())
        if self.group is not None and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            amax = amax.float().clone()  # the collective writes it
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        with torch.no_grad():
            if serves_history(self.amax_history):
                history, for_scale = on_device(self.amax_history, self.amax_for_scale, amax, self.algo)
            else:
                history, for_scale = updated_history(self.amax_history, self.amax_for_scale, amax.float(), self.algo)
            self.amax_history.copy_(history)
            self.amax_for_scale.copy_(for_scale)

    def _apply(self, fn, recurse: bool = True):
        """Moves between devices but keeps float32 (TE keeps its FP8 metadata in FP32): a 16-bit
        model (megatron-core's Float16Module calls ``.bfloat16()``) would round the amaxes."""
        device = fn(torch.empty(0, device=self.amax_history.device)).device
        for name, buffer in self._buffers.items():
            self._buffers[name] = buffer.to(device)
        return self

    def extra_repr(self) -> str:
        return f"length={self.amax_history.numel()}, algo={self.algo!r}"


def amax_reduction_group(tp_group: Optional[dist.ProcessGroup], tp_only: bool) -> Optional[dist.ProcessGroup]:
    """Megatron-LM's FP8 amax reduction group: tensor x data (x context) parallel ranks, or the
    tensor-parallel ranks only with ``tp_only`` (``--tp-only-amax-red``); ``tp_group`` where
    megatron-core's parallel state is not initialized."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return tp_group
    return parallel_state.get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red=tp_only)
