"""Modes: how the model runs for one pass. A mode is ``fp32`` (the reference), a pass-through
dtype (``bf16``, ``fp16``: the whole model in that dtype), a format name (fake-quantized GEMM
operands, model in ``quant_dtype``), or a recipe file (.yaml/.yml/.json).
Presets as the original tool: ``essential``, ``quant_only``, ``all``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.registry import PASSTHROUGH

REFERENCE = "fp32"
# The formats that are plain dtypes: their modes run the whole model in that dtype.
PASSTHROUGH_DTYPES = {name: get_format(name).dtype for name in PASSTHROUGH}
ESSENTIAL = ("fp32", "bf16", "hifp8", "mxfp8", "mxfp4")
PRESETS = ("all", "essential", "quant_only")
RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Mode:
    name: str                     # the token in .npz keys and reports
    recipe: object                # megatron.quant.recipes.recipe.QuantRecipe
    params_dtype: torch.dtype
    kind: str                     # "dtype" (fp32/bf16/fp16, no fake quantization), "format" or "recipe"


def quantized_formats() -> list[str]:
    """Every registered format that fake-quantizes (``quant_only``)."""
    from megatron.quant import formats

    return [name for name in formats.list_formats() if not formats.is_passthrough(name)]


def expand_presets(requested: Sequence[str]) -> list[str]:
    """Mode tokens with presets expanded, duplicates dropped, the fp32 reference first."""
    expanded: list[str] = []
    for token in requested:
        if token == "essential":
            expanded += ESSENTIAL
        elif token == "quant_only":
            expanded += quantized_formats()
        elif token == "all":
            expanded += [*PASSTHROUGH_DTYPES, *quantized_formats()]
        else:
            expanded.append(token)
    ordered = [REFERENCE] + [token for token in expanded if token != REFERENCE]
    first_spelling: dict[str, str] = {}  # one run per format: a later alias of it is dropped
    for token in ordered:
        first_spelling.setdefault(_canonical(token), token)
    return list(first_spelling.values())


def resolve_modes(requested: Sequence[str], quant_dtype: torch.dtype = torch.float32) -> list[Mode]:
    """Modes for tokens (presets, dtypes, format names, recipe files); ValueError on unknown names."""
    modes = [_resolve(token, quant_dtype) for token in expand_presets(requested)]
    names = [mode.name for mode in modes]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"modes {duplicates} are given twice (a recipe's name equals another mode's)")
    return modes


def _canonical(token: str) -> str:
    from megatron.quant import formats

    try:
        return formats.get_format(token).name
    except ValueError:
        return token  # a dtype, a recipe file, or an unknown name that resolve_modes reports


def _resolve(token: str, quant_dtype: torch.dtype) -> Mode:
    from megatron.quant import formats
    from megatron.quant.recipes.recipe import QuantRecipe

    if token.endswith(RECIPE_SUFFIXES):
        return _recipe_mode(token, quant_dtype)
    canonical = _canonical(token)
    if canonical in PASSTHROUGH_DTYPES:  # "none" is fp32
        return Mode(token, QuantRecipe.uniform(canonical), PASSTHROUGH_DTYPES[canonical], "dtype")
    if canonical in formats.list_formats():
        return Mode(token, QuantRecipe.uniform(token), quant_dtype, "format")
    if Path(token).is_file():
        return _recipe_mode(token, quant_dtype)
    raise ValueError(
        f"unknown mode {token!r}; valid: presets {list(PRESETS)}, dtypes {list(PASSTHROUGH_DTYPES)}, "
        f"formats {quantized_formats()}, or a recipe file ({'/'.join(RECIPE_SUFFIXES)})")


def _recipe_mode(path: str, quant_dtype: torch.dtype) -> Mode:
    from megatron.quant.recipes.recipe import QuantRecipe

    if not Path(path).is_file():
        raise FileNotFoundError(f"recipe file {path!r} does not exist")
    recipe = QuantRecipe.from_file(path)
    return Mode(recipe.name, recipe, quant_dtype, "recipe")
