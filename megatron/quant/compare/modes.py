"""Modes: how the model runs for one pass. A mode is ``fp32`` (the reference), a pass-through
dtype (``bf16``, ``fp16``: the whole model in that dtype), a format name (fake-quantized GEMM
operands, model in ``quant_dtype``), or a recipe file (.yaml/.yml/.json).
Sets as the original tool's presets: ``essential``, ``quant_only``, ``all`` (``recipes.sets``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.registry import PASSTHROUGH
from megatron.quant.recipes.sets import RECIPE_SUFFIXES, SETS, canonical, expand_sets, quantized_formats

# The formats that are plain dtypes: their modes run the whole model in that dtype.
PASSTHROUGH_DTYPES = {name: get_format(name).dtype for name in PASSTHROUGH}


@dataclass(frozen=True)
class Mode:
    name: str                     # the token in .npz keys and reports
    recipe: object                # megatron.quant.recipes.recipe.QuantRecipe
    params_dtype: torch.dtype
    kind: str                     # "dtype" (fp32/bf16/fp16, no fake quantization), "format" or "recipe"


def resolve_modes(requested: Sequence[str], quant_dtype: torch.dtype = torch.float32) -> list[Mode]:
    """Modes for tokens (presets, dtypes, format names, recipe files); ValueError on unknown names."""
    modes = [_resolve(token, quant_dtype) for token in expand_sets(requested)]
    names = [mode.name for mode in modes]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"modes {duplicates} are given twice (a recipe's name equals another mode's)")
    return modes


def _resolve(token: str, quant_dtype: torch.dtype) -> Mode:
    from megatron.quant import formats
    from megatron.quant.recipes.recipe import QuantRecipe

    if token.endswith(RECIPE_SUFFIXES):
        return _recipe_mode(token, quant_dtype)
    name = canonical(token)
    if name in PASSTHROUGH_DTYPES:  # "none" is fp32
        return Mode(token, QuantRecipe.uniform(name), PASSTHROUGH_DTYPES[name], "dtype")
    if name in formats.list_formats():
        return Mode(token, QuantRecipe.uniform(token), quant_dtype, "format")
    if Path(token).is_file():
        return _recipe_mode(token, quant_dtype)
    raise ValueError(
        f"unknown mode {token!r}; valid: presets {list(SETS)}, dtypes {list(PASSTHROUGH_DTYPES)}, "
        f"formats {quantized_formats()}, or a recipe file ({'/'.join(RECIPE_SUFFIXES)})")


def _recipe_mode(path: str, quant_dtype: torch.dtype) -> Mode:
    from megatron.quant.recipes.recipe import QuantRecipe

    if not Path(path).is_file():
        raise FileNotFoundError(f"recipe file {path!r} does not exist")
    recipe = QuantRecipe.from_file(path)
    return Mode(recipe.name, recipe, quant_dtype, "recipe")
