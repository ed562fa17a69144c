"""Delayed scaling's state on a layer: a fresh ``AmaxHistory`` for every delayed-scaled operand spec,
registered on the module (``amax_histories``) so it is in the state dict and in checkpoints
(``delayed`` holds the scaling rule and the history module).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from megatron.quant.layers.delayed import HISTORIES, AmaxHistory, is_delayed
from megatron.quant.recipes.operands import OperandSpec


def attach_histories(quant: Any, owner: torch.nn.Module, group: Optional[dist.ProcessGroup]) -> Any:
    """``quant`` (a dataclass of ``OperandSpec``s, or of mappings of them, possibly nested) with a fresh
    ``AmaxHistory`` on every delayed-scaled operand, registered under ``owner.amax_histories`` by operand
    key (none registered, and any earlier ones dropped, when no operand is delayed)."""
    histories = torch.nn.ModuleDict()
    attached = _attach(quant, histories, group)
    if HISTORIES in owner._modules:
        del owner._modules[HISTORIES]
    if len(histories):
        setattr(owner, HISTORIES, histories)
    return attached


def _attach(value: Any, histories: torch.nn.ModuleDict, group: Optional[dist.ProcessGroup]) -> Any:
    if isinstance(value, Mapping):
        return {key: _attach(item, histories, group) for key, item in value.items()}
    if not dataclasses.is_dataclass(value):
        return value
    if isinstance(value, OperandSpec):
        if not is_delayed(value.fmt):
            return value
        history = AmaxHistory(value.fmt.options["amax_history_len"], value.fmt.options["amax_compute_algo"], group)
        histories[value.name.replace(".", "_")] = history
        return dataclasses.replace(value, history=history)
    return dataclasses.replace(value, **{f.name: _attach(getattr(value, f.name), histories, group)
                                         for f in dataclasses.fields(value)})
