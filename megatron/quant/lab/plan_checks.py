"""A study plan's recipes and training flags checked as the sweep will use them, and its text checked
for the lines the sizing writes into; each problem one bounded line (the plan reader adds the file and
the key)."""
from __future__ import annotations

import re
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


# The lines of a plan that the sizing (lab/study_sizing.py) rewrites with the size it chose: (before, value, comment).
SIZED_LINES = {"preset": r"^(  preset: *)(\S+)( *#.*)?$", "train_iters": r"^(train_iters: *)(\d+)( *#.*)?$",
               "eval_interval": r"^(eval_interval: *)(\d+)( *#.*)?$", "fixed_on": r"^(  fixed_on: *)(.*?)( *#.*)?$"}


def sized_lines_problem(text: str) -> str | None:
    """Why the sizing could not write its size into the plan ``text``, or None: each of
    ``SIZED_LINES`` must be there, one key a line in block style."""
    missing = [key for key, pattern in SIZED_LINES.items() if not re.search(pattern, text, flags=re.MULTILINE)]
    if not missing:
        return None
    return (f"no line for {', '.join(missing)} in block style (e.g. 'train_iters: 521', '  fixed_on: null' under "
            "sizing:): the sizing writes its size into these lines")
