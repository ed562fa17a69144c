"""What-if formats while training: the format another recipe would give a captured GEMM operand.

A what-if name is a format (``mxfp8``, ``hifp8``), a preset (``te-nvfp4``) or one of TE's recipe names
(``fp8_current_scaling``: ``te_names.TE_RECIPES``); ``/columnwise`` after it asks for the operand's other
orientation (the GEMM that reduces it along the other axis: wgrad's for activations and gradients,
dgrad's for weights); ``run/columnwise`` is the run's own format there. The operand keys and axes come
from ``operands.LINEAR_TABLE``: a captured ``input``, ``weight`` or ``grad_output`` is rowwise in the
first GEMM of its role and columnwise in the second.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Optional

from megatron.quant import formats
from megatron.quant.formats.base import NumericFormat
from megatron.quant.formats.show import show_value
from megatron.quant.recipes.operands import LINEAR_ROLES, LINEAR_TABLE, MLA_ROLES
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.recipes.rules import FormatChoice
from megatron.quant.stats import TE_RECIPES

COLUMNWISE = "/columnwise"
RUN = "run"
# captured tensor name -> (rowwise operand, columnwise operand), as (recipe key, block axis on the 2-D view)
ORIENTATIONS: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    role: tuple((op.key, op.axis) for op in LINEAR_TABLE if op.role == role)  # type: ignore[misc]
    for role in dict.fromkeys(op.role for op in LINEAR_TABLE)
}


MAX_SOURCES = 32  # what-if sources a run takes: each adds a quantization of every captured operand
MAX_CHARS = 4096  # the longest TENSOR_SAVE_WHATIF value read (a list of MAX_SOURCES names fits many times)


def parse_whatif(value: str, source: str) -> tuple[str, ...]:
    """``TENSOR_SAVE_WHATIF``: comma-separated format, preset or TE recipe names; a one-line ValueError,
    its echo cut, names a bad one, a list of more than ``MAX_SOURCES`` or a value over ``MAX_CHARS``."""
    shown = show_value(value)
    if len(value) > MAX_CHARS:
        raise ValueError(f"{source}={shown}: {len(value)} characters, at most {MAX_CHARS} are read "
                         f"(a comma-separated list of at most {MAX_SOURCES} names)")
    names = tuple(dict.fromkeys(item.strip() for item in value.split(",") if item.strip()))
    if len(names) > MAX_SOURCES:
        raise ValueError(f"{source}={shown}: {len(names)} names, at most {MAX_SOURCES} (each quantizes every "
                         f"captured operand once more)")
    for name in names:
        try:
            recipe = whatif_recipe(name)
        except ValueError as exc:
            raise ValueError(f"{source}={shown}: {show_value(name, 60)} is not a format, preset or TE recipe name "
                             f"({', '.join(TE_RECIPES)}): {' '.join(str(exc).split())[:200]}") from None
        if dict(recipe.format.options).get("scaling") == "delayed":
            raise ValueError(f"{source}={shown}: {name!r} scales from an amax history, which only the run's own "
                             f"quantization has (TE cannot recreate it either)")
    return names


def check_layer_count(names: tuple[str, ...], num_layers: Optional[int]) -> None:
    """ValueError naming the first what-if source with layer rules when the model's layer count is not
    known (its rules count layers from the last), before any capture."""
    if num_layers is not None:
        return
    for name in names:
        bare = name[:-len(COLUMNWISE)] if name.endswith(COLUMNWISE) else name
        if bare != RUN and whatif_recipe(bare).rules:
            raise ValueError(f"what-if {name!r} has layer rules: the model's layer count is needed "
                             f"(tensor_saver.configure(num_layers=...), as training passes it)")


@functools.lru_cache(maxsize=64)
def whatif_recipe(name: str) -> QuantRecipe:
    """The recipe a what-if name stands for (TE's recipe names map to the lab's presets)."""
    return QuantRecipe.from_dict({"format": TE_RECIPES.get(name, name)}, source=f"what-if {name}")


class WhatIfFormats:
    """Resolves (what-if source, module role and layer, captured tensor) to a format and axis;
    ``run_choices`` (module path -> operand key -> the run's choice) serves ``run/columnwise``;
    ``num_layers``: the model's, which a recipe's layer rules count from (``-1:`` is the last layer)."""

    def __init__(self, num_layers: Optional[int] = None,
                 run_choices: Optional[Mapping[str, Mapping[str, FormatChoice]]] = None) -> None:
        self._num_layers = num_layers
        self._run = run_choices or {}
        self._built: dict[FormatChoice, NumericFormat] = {}

    def format_for(self, source: str, module: str, role: str, layer_idx: int,
                   tensor_name: str) -> Optional[tuple[NumericFormat, int]]:
        """(format, block axis on the [-1, last dim] view), or None where the source leaves the operand
        unquantized or the tensor is not a linear GEMM operand."""
        if tensor_name not in ORIENTATIONS or role not in LINEAR_ROLES + MLA_ROLES + ("output_layer",):
            return None  # attention's products have operands of their own (recipes.operands.BMM_SLOTS)
        name, columnwise = (source[:-len(COLUMNWISE)], True) if source.endswith(COLUMNWISE) else (source, False)
        key, axis = ORIENTATIONS[tensor_name][int(columnwise)]
        if name == RUN:
            choice = self._run.get(module, {}).get(key)
        else:
            check_layer_count((name,), self._num_layers)
            recipe = whatif_recipe(name)
            num_layers = max(layer_idx, 0) + 1 if self._num_layers is None else self._num_layers  # no rules: any
            choice = (_head_choice(recipe, key, num_layers) if role == "output_layer"
                      else recipe.choices(role, layer_idx, num_layers)[key])
        if choice is None or formats.is_passthrough(choice.name):
            return None
        if choice not in self._built:
            self._built[choice] = formats.get_format(choice.name, **dict(choice.options))
        return self._built[choice], axis


def _head_choice(recipe: QuantRecipe, key: str, num_layers: int) -> FormatChoice:
    """The LM head's format under ``recipe``: what a rule naming ``output_layer`` gives it, else the
    recipe's own format for a linear layer (a preset scoped to the decoder's linear layers leaves the
    head out, but the question asked is how the head's operands would fare). A decoder layer's rules
    (``te-nvfp4+bf16-layers``' BF16 first and last layers) are not the head's."""
    if any(rule.matches("output_layer", -1, num_layers) for rule in recipe.rules):  # as the run resolves it
        return recipe.choices("output_layer", -1, num_layers)[key]
    return dataclasses.replace(recipe, rules=()).choices("fc2", 0, num_layers)[key]
