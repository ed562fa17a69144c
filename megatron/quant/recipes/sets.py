"""Named sets of recipe tokens, shared by the layer I/O comparison and the sweep: ``essential``,
``quant_only`` and ``all`` (the original tool's comparison presets), and the recipe-file suffixes."""
from __future__ import annotations

from typing import Sequence

from megatron.quant import formats
from megatron.quant.formats.registry import PASSTHROUGH

REFERENCE = "fp32"
ESSENTIAL = ("fp32", "bf16", "hifp8", "mxfp8", "mxfp4")
SETS = ("all", "essential", "quant_only")
RECIPE_SUFFIXES = (".yaml", ".yml", ".json")


def quantized_formats() -> list[str]:
    """Every registered format that fake-quantizes (``quant_only``)."""
    return [name for name in formats.list_formats() if not formats.is_passthrough(name)]


def expand_sets(requested: Sequence[str]) -> list[str]:
    """Tokens with the sets expanded, duplicates dropped, the fp32 reference first."""
    expanded: list[str] = []
    for token in requested:
        if token == "essential":
            expanded += ESSENTIAL
        elif token == "quant_only":
            expanded += quantized_formats()
        elif token == "all":
            expanded += [*PASSTHROUGH, *quantized_formats()]
        else:
            expanded.append(token)
    ordered = [REFERENCE] + [token for token in expanded if token != REFERENCE]
    first_spelling: dict[str, str] = {}  # one run per format: a later alias of it is dropped
    for token in ordered:
        first_spelling.setdefault(canonical(token), token)
    return list(first_spelling.values())


def canonical(token: str) -> str:
    """A format's registered name for any of its spellings; other tokens unchanged."""
    try:
        return formats.get_format(token).name
    except ValueError:
        return token  # a dtype, a recipe file, or an unknown name that the caller reports
