"""The parts of a recipe: a format choice (name and options) and a rule (which modules, what format)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from megatron.quant.recipes.operands import NAMED_ONLY_ROLES
from megatron.quant.settings.selectors import Selector as LayerSelector

DEFAULT_SCOPE = ("linear", "attention")
PASSTHROUGH_DEFAULT = "bf16"


@dataclass(frozen=True)
class FormatChoice:
    """A format name (or passthrough) and its options; ``name`` None keeps the inherited name."""

    name: Optional[str] = None
    options: tuple[tuple[str, Any], ...] = ()

    def over(self, base: "FormatChoice") -> "FormatChoice":
        """This choice applied on top of ``base`` (options merge only when the format is kept)."""
        if self.name is None or self.name == base.name:
            return FormatChoice(base.name, tuple({**dict(base.options), **dict(self.options)}.items()))
        return self


@dataclass(frozen=True)
class Rule:
    roles: Optional[frozenset[str]] = None
    layers: Optional[tuple[LayerSelector, ...]] = None
    format: Optional[FormatChoice] = None
    operands: tuple[tuple[str, FormatChoice], ...] = ()

    def matches(self, role: str, layer_idx: int, num_layers: int) -> bool:
        if self.roles is None and role in NAMED_ONLY_ROLES:
            return False  # the LM head and the router are quantized only by rules that name them
        if self.roles is not None and role not in self.roles:
            return False
        return self.layers is None or any(s.matches(layer_idx, num_layers) for s in self.layers)
