"""A study plan's recipes and training flags checked as the sweep will use them, each problem one
bounded line (the plan reader adds the file and the key)."""
from __future__ import annotations

from typing import Sequence

from megatron.quant.formats.show import show_value
from megatron.quant.lab.sweep_plan import SweepError, check_flag_values


def recipe_problem(name: str) -> str | None:
    """Why ``name`` cannot be a plan's recipe, or None: it must resolve as ``python -m
    megatron.quant.recipes show NAME`` resolves it, and not be a file (the sweep names a file's run
    after the recipe inside, not after the plan's entry, so the plan would never find its run)."""
    from megatron.quant.recipes.cli import is_recipe_file, load
    from megatron.quant.recipes.recipe import RecipeError

    if is_recipe_file(name):
        return f"{show_value(name)} is a recipe file; allowed: presets, their variants and format names"
    try:
        load(name)
    except (RecipeError, ValueError) as error:
        return str(error).splitlines()[0]
    return None


def flags_problem(flags: Sequence[str], own: Sequence[str]) -> str | None:
    """Why ``flags`` cannot be a plan's training flags, or None: one of ``own`` (set by the plan's keys
    or per run), or a value the trainer's parser refuses (named with its flag, not the whole line)."""
    given = [flag for flag in flags if flag.split("=", 1)[0] in own]
    if given:
        return f"{', '.join(given)[:200]} set by the plan's own keys or per run; drop them"
    try:
        check_flag_values([*flags, "--train-iters", "1"], "")  # the plan's own key, required by the parser
    except SweepError as error:
        return str(error)
    return None
