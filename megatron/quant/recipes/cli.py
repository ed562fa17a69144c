"""``python -m megatron.quant.recipes show [NAME] [--num-layers N] [--ablate]``: what a recipe quantizes, and how.

NAME is a preset (``te-nvfp4``), a variant (``te-nvfp4-no-sr``, ``mxfp4+sr``), a format name
(``mxfp8``) or a recipe file; without it, the presets and their variants are listed; ``--ablate``
shows NAME and each of its variants (``ablations.ablation``). For each group of decoder layers
that resolve alike, one table per group of roles that resolve alike: operand, format, block,
axis, transform, scaling, rounding.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import yaml

from megatron.quant import formats
from megatron.quant.formats.accumulation import fp8_kind
from megatron.quant.formats.base import NumericFormat
from megatron.quant.recipes import ablations, presets
from megatron.quant.recipes.operands import FORWARD_TWINS, LINEAR_ROLES, OPERAND_AXES
from megatron.quant.recipes.parse import load_yaml
from megatron.quant.recipes.recipe import QuantRecipe, RecipeError
from megatron.quant.recipes.rules import FormatChoice
from megatron.quant.settings.selectors import format_indices

COLUMNS = ("operand", "format", "block", "axis", "transform", "scaling", "rounding")
DEFAULT_NUM_LAYERS = 16


def is_recipe_file(name: str) -> bool:
    """``name`` names a recipe file (by its suffix, or an existing path) rather than a preset or format."""
    return name.lower().endswith((".yaml", ".yml", ".json")) or Path(name).is_file()


def load(name: str) -> QuantRecipe:
    """A recipe file (by suffix or an existing path), else a preset or format name."""
    if is_recipe_file(name):
        return QuantRecipe.from_file(name)
    return QuantRecipe.from_dict({"format": name}, source=name)


def is_precision_file(name: str) -> bool:
    """``name`` is a per-module precision file (megatron-core's RecipeConfig YAML: ``configs`` and
    ``matchers``), not a recipe file."""
    if not is_recipe_file(name) or not Path(name).is_file():
        return False
    try:
        data = load_yaml(Path(name).read_text(encoding="utf-8"), name)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the recipe reader says what is wrong with it
    return isinstance(data, dict) and "configs" in data


def describe_precision(name: str, num_layers: int) -> str:
    """A precision file's matchers in order, then each config's operand tables."""
    from megatron.quant.recipes.precision_file import load_precision_file  # imports megatron-core

    precision = load_precision_file(name)
    lines = [f"{precision.source}: per-module precision; the first matcher whose pattern matches a module's name "
             "chooses its config:", *(f"  {matcher!r}" for matcher in precision.matchers)]
    tables = [f"config {key}:\n{describe(recipe, num_layers)}" for key, recipe in precision.configs.items()]
    return "\n\n".join(["\n".join(lines), *tables])


def _scaling(fmt: NumericFormat) -> str:
    opts = fmt.options
    if fmt.name == "nvfp4":
        choice = f" (4over6 {opts['four_over_six']})" if opts["four_over_six"] != "off" else ""
        bound = f", e4m3 bound {opts['e4m3_max']}" if opts["e4m3_max"] != 448 else ""
        text = f"e4m3 block{choice} + fp32 {'row' if opts['row_scaled'] else 'tensor'}{bound}"
    elif "scale_mode" in opts:
        text = f"e8m0 block ({opts['scale_mode']})"
    elif opts.get("scaling") == "delayed":
        text = f"delayed ({opts['amax_compute_algo'].replace('_', ' ')} of {opts['amax_history_len']})"
    else:
        text = opts.get("scaling", "none")
    if opts.get("power_of_two_scales"):
        text += ", 2^k"
    if opts.get("margin"):
        text += f", margin {opts['margin']}"
    if opts.get("nonfinite") == "te":
        text += ", te nonfinite"
    return text


def operand_row(key: str, choice: FormatChoice, axis: int, source: Optional[str] = None) -> tuple[str, ...]:
    """One table row; a passthrough operand shows its name and dashes. ``source``: the forward operand
    whose dequantized values it takes (shown as its transform)."""
    taken = f"{source} dequantized" if source else None
    if formats.is_passthrough(choice.name):
        return (key, choice.name, "-", "-", taken or "-", "-", "-")
    fmt = formats.get_format(choice.name, **dict(choice.options))
    block = fmt.options.get("block_shape")
    hadamard = fmt.options.get("hadamard")
    transform = ", ".join(t for t in (taken, f"hadamard {hadamard}" if hadamard else None) if t)
    return (key, fmt.name, "x".join(map(str, block)) if block else "-", str(axis) if block else "-",
            transform or "-", _scaling(fmt), fmt.rounding)


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in (COLUMNS, *rows)) for i in range(len(COLUMNS))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in (COLUMNS, *rows)]


def _role_tables(recipe: QuantRecipe, layer: int, num_layers: int, roles: Sequence[str],
                 axes: dict[str, int]) -> list[str]:
    """Roles that resolve alike share one table; unquantized roles one line."""
    tables: dict[tuple, list[str]] = {}
    for role in roles:
        sources = recipe.dequantized_sources() if role != "core_attention" else frozenset()
        rows = tuple(operand_row(k, c, axes[k], FORWARD_TWINS[k] if k in sources else None)
                     for k, c in recipe.choices(role, layer, num_layers).items())
        tables.setdefault(rows, []).append(role)
    lines = []
    for rows, group in tables.items():
        if all(formats.is_passthrough(r[1]) for r in rows):
            lines.append(f" {', '.join(group)}: not quantized")
        else:
            lines += [f" {', '.join(group)}:", *_table(rows)]
    return lines


def describe(recipe: QuantRecipe, num_layers: int = DEFAULT_NUM_LAYERS, source: Optional[str] = None) -> str:
    """The operand tables of ``recipe`` for a ``num_layers``-layer model, layers that differ shown apart."""
    axes = OPERAND_AXES
    roles = (*LINEAR_ROLES, "core_attention", "router")  # the router: MoE layers' only
    by_layer: dict[tuple, list[int]] = {}
    for layer in range(num_layers):
        key = tuple(tuple(recipe.choices(r, layer, num_layers).items()) for r in roles)
        by_layer.setdefault(key, []).append(layer)
    lines = [f"recipe {recipe.name}" + (f" (reproduces {source})" if source else "")
             + f", {num_layers} decoder layers" + (", compiled" if recipe.compile else "")
             + (f", backward_override {recipe.backward_override}" if recipe.backward_override else "")]
    for layers in sorted(by_layer.values(), key=len, reverse=True):
        lines.append(f"layers {format_indices(layers)}:")
        lines += _role_tables(recipe, layers[0], num_layers, roles, axes)
    lines += _role_tables(recipe, -1, num_layers, ("output_layer",), axes)
    lines.append(accumulation_line(recipe, num_layers))
    if recipe.schedule:  # the phases' formats replace the tables' for their direction's operands
        lines.append(f"schedule: {recipe.schedule.describe()} (iterations as the run numbers them; fractions "
                     f"of --train-iters)")
    return "\n".join(lines)


EXACT = "-no-hopper-acc"  # the ablation component that gives a recipe with Hopper accumulation exact sums


def accumulation_line(recipe: QuantRecipe, num_layers: int) -> str:
    """How the linear GEMMs add their products, per GEMM, and what Transformer Engine does on Hopper
    with the recipe's formats (``presets.te_hopper_accumulation``) where that is known."""
    modes = recipe.accumulation()
    exact = set(modes.values()) == {"exact"}
    line = "accumulate: " + ("exact FP32 sums" if exact else ", ".join(f"{gemm} {mode}" for gemm, mode in modes.items())
                             + " (a Hopper FP8 tensor core's accumulator)")
    te = presets.te_hopper_accumulation([_te_kind(fmt) for fmt in recipe.formats(num_layers)])
    if te is None:
        return line
    if isinstance(te, str):
        return f"{line}; TE on Hopper: {te}"
    shown = ", ".join(f"{gemm} {mode}" for gemm, mode in te.items())
    if modes == te:
        return f"{line}; Transformer Engine's default on Hopper (exact sums: accumulate: exact, or the variant {EXACT})"
    return f"{line}; TE on Hopper: {shown}"


def _te_kind(fmt: NumericFormat) -> str:
    """What TE's Hopper GEMM of operands in ``fmt`` is: "tensor" (per-tensor scaled FP8, which the
    accumulator model covers), "block" (FP8 with FP32 block scales), or "other" (MX, NVFP4, ...)."""
    if fp8_kind(fmt) is not None:
        return "tensor"
    return "block" if fmt.scaling == "block" and fmt.name in ("fp8_e4m3", "fp8_e5m2") else "other"  # not MX


def list_presets() -> str:
    """The names a recipe can be given by: the formats (every GEMM operand in that format, as
    CUSTOM_QUANT_TYPE=NAME), the TE presets, and the variants."""
    lines = ["formats (CUSTOM_QUANT_TYPE=NAME: every quantized GEMM operand in it; bf16: none; "
             "python -m megatron.quant.formats shows each):", *_wrapped(formats.list_formats()),
             "  aliases: " + ", ".join(f"{alias} = {name}" for alias, name in formats.registry.ALIASES.items()),
             "presets (CUSTOM_QUANT_TYPE=NAME, or format: NAME in a recipe file):"]
    lines += [f"  {name:<18} {source}" for name, (source, _) in presets.PRESETS.items()]
    lines.append("variants (one component removed or added; show NAME --ablate shows each):")
    for base in dict.fromkeys([*presets.PRESETS, *ablations.ADDITIONS]):
        variants = ablations.ablation(base)[1:]
        if variants:
            lines.append(f"  {base:<18} {', '.join(variants)}")
    lines.append(f"  components: {', '.join(f'{c.name} ({c.description})' for c in ablations.COMPONENTS.values())}")
    return "\n".join(lines)


def _wrapped(names: Sequence[str], width: int = 96) -> list[str]:
    """``names`` comma-separated on indented lines of at most about ``width`` characters."""
    lines, line = [], ""
    for name in names:
        if line and len(line) + len(name) + 2 > width:
            lines.append(f"  {line},")
            line = ""
        line = f"{line}, {name}" if line else name
    return [*lines, f"  {line}"] if line else lines


def _source(name: str) -> Optional[str]:
    """What a preset reproduces, or what a variant changes; None for format names and files."""
    if presets.is_preset(name):
        return presets.preset_source(name)
    return ablations.describe_variant(name) if ablations.is_variant(name) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megatron.quant.recipes",
                                     description="Show what a recipe quantizes.")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="operand table of a preset, format name or recipe file; "
                                       "no NAME: list the presets")
    show.add_argument("name", nargs="?")
    show.add_argument("--num-layers", type=int, default=DEFAULT_NUM_LAYERS,
                      help="decoder layers, for layer rules (default: %(default)s)")
    show.add_argument("--ablate", action="store_true",
                      help="also show each variant with one component removed or added (as the sweep's --ablate)")
    args = parser.parse_args(argv)
    if args.name is None:
        print(list_presets())
        return 0
    if args.num_layers < 1:
        parser.error(f"--num-layers must be positive, got {args.num_layers}")
    try:
        if not args.ablate and is_precision_file(args.name):
            print(describe_precision(args.name, args.num_layers))
            return 0
        names = ablations.ablation(args.name) if args.ablate else [args.name]
        recipes = [load(name) for name in names]
    except (RecipeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n\n".join(describe(recipe, args.num_layers, _source(name)) for name, recipe in zip(names, recipes)))
    return 0
