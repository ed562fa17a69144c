"""Capture chosen decoder layers' (or their sub-modules') input and output with forward hooks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

# Short names for the usual sub-modules of a megatron-core TransformerLayer.
SUBMODULE_ALIASES = {"attention": "self_attention", "mlp": "mlp"}


@dataclass(frozen=True)
class Target:
    """One module whose input and output are captured."""
    layer: int                 # 0-based decoder layer index (negative indices already resolved)
    submodule: str | None      # path inside the layer, e.g. "self_attention"; None = the whole layer
    label: str                 # key token, e.g. "L0", "L3_mlp", "L3_self_attention.linear_qkv"

    @property
    def module_path(self) -> str:
        base = f"decoder.layers.{self.layer}"
        return f"{base}.{self.submodule}" if self.submodule else base


def resolve_targets(layers: Sequence[int], submodule: str | None, num_layers: int) -> list[Target]:
    """Targets for layer indices (negative counts from the end, as in Python) and an optional sub-module."""
    if not layers:
        raise ValueError("--layers needs at least one layer index")
    path = SUBMODULE_ALIASES.get(submodule, submodule) if submodule else None
    targets: list[Target] = []
    for index in layers:
        if not -num_layers <= index < num_layers:
            raise ValueError(f"--layers {index} is out of range: the model has {num_layers} layers "
                             f"(valid: 0..{num_layers - 1} or -{num_layers}..-1)")
        layer = index % num_layers
        label = f"L{layer}" + (f"_{path}" if path else "")
        if all(t.layer != layer for t in targets):
            targets.append(Target(layer, path, label))
    return targets


def capture_layer_io(model: torch.nn.Module, tokens: torch.Tensor,
                     targets: Sequence[Target]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run ``model`` once on ``tokens`` [batch, seq]; return {label: (input, output)} as float32
    arrays, batch-first ([batch, seq, ...]; megatron-core's activations are sequence-first)."""
    modules = dict(model.named_modules())
    captured: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    handles = []
    for target in targets:
        module = modules.get(target.module_path)
        if module is None:
            raise ValueError(f"the model has no module {target.module_path!r}; sub-modules of layer "
                             f"{target.layer}: {_children_of(modules, f'decoder.layers.{target.layer}')}")
        handles.append(module.register_forward_hook(_recorder(target.label, captured), with_kwargs=True))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model(tokens.to(device), positions.to(device), None)
    finally:
        for handle in handles:
            handle.remove()
    missing = [t.module_path for t in targets if t.label not in captured]
    if missing:
        raise RuntimeError(f"modules never ran in the forward pass: {missing}")
    return captured


def _recorder(label: str, captured: dict):
    def hook(module, args, kwargs, output):
        hidden = kwargs.get("hidden_states")
        inputs = hidden if isinstance(hidden, torch.Tensor) else _first_tensor((*args, *kwargs.values()))
        captured[label] = (_to_batch_first(inputs), _to_batch_first(_first_tensor(output)))
    return hook


def _first_tensor(values) -> torch.Tensor:
    # megatron-core modules return (output, bias) or (hidden_states, context) tuples.
    if isinstance(values, torch.Tensor):
        return values
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no tensor among {type(values).__name__} values")


def _to_batch_first(x: torch.Tensor) -> np.ndarray:
    x = x.detach().float().cpu()
    return (x.transpose(0, 1) if x.dim() >= 2 else x).contiguous().numpy()


def _children_of(modules: dict, prefix: str) -> list[str]:
    # Two levels (self_attention, self_attention.linear_qkv) name every useful target.
    relative = (name[len(prefix) + 1:] for name in modules if name.startswith(prefix + "."))
    return sorted(name for name in relative if name.count(".") <= 1)
