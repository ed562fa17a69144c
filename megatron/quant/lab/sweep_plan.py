"""A sweep's runs before any starts: recipe tokens (sets, presets, variants, files) resolved to run
names and environments, seed and ablation runs, the training flags checked once, and each run's
training command.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from megatron.quant.recipes.sets import RECIPE_SUFFIXES, SETS, expand_sets
from megatron.quant.training.arguments import parse_args
from megatron.quant.training.data import check_data

CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"


SEED_SUFFIX = "-seed"  # run NAME-seedN: recipe NAME with --seed N (the report's seed bands)


# The sweep sets these per run.
_OWN_FLAGS = ("save", "load", "tensorboard_dir")


class SweepError(ValueError):
    """Bad sweep input; the message names the value and what is allowed."""


@dataclass(frozen=True)
class SweepRun:
    name: str                    # directory under OUTPUT_DIR
    recipe: str                  # the recipe token as given (format name or recipe file)
    env: tuple[tuple[str, str], ...]  # the recipe's environment variables
    extra_flags: tuple[str, ...] = ()  # e.g. a seed run's --seed N


def _recipe_tokens(text: str) -> list[str]:
    """Recipe tokens with the comparison presets (essential, quant_only, all) expanded."""
    tokens: list[str] = []
    for token in text.replace(",", " ").split():
        if token in SETS:  # expand_sets puts its fp32 reference first: keep it only if the set has it
            expanded = expand_sets([token])
            tokens += expanded if token != "quant_only" else expanded[1:]
        else:
            tokens.append(token)
    return tokens


def resolve_recipe(token: str) -> tuple[str, dict[str, str]]:
    """(run name, recipe environment) for a format name, a recipe preset (te-nvfp4, ...) or a recipe file."""
    from megatron.quant import formats
    from megatron.quant.recipes import ablations, presets
    from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

    if token.lower().endswith(RECIPE_SUFFIXES) or Path(token).is_file():
        if not Path(token).is_file():
            raise SweepError(f"recipe file {token!r} does not exist")
        try:
            name = QuantRecipe.from_file(token).name
        except RecipeError as error:
            raise SweepError(str(error)) from error
        return name, {"CUSTOM_QUANT_RECIPE": str(Path(token).resolve())}
    valid = sorted(set(formats.list_formats()) | set(formats.ALIASES)) + presets.preset_names()
    try:
        variant = ablations.is_variant(token) and ablations.get_variant(token)
    except ablations.AblationError as error:
        raise SweepError(str(error)) from error
    if token.lower() not in valid and not variant:
        raise SweepError(f"unknown recipe {token!r}; give format names or recipe presets ({', '.join(valid)}), "
                         f"their variants (te-nvfp4-no-sr, mxfp4+sr, ...; see --ablate), "
                         f"comparison presets ({', '.join(SETS)}) or recipe files ({'/'.join(RECIPE_SUFFIXES)})")
    return token, {"CUSTOM_QUANT_TYPE": token.lower()}


def ablation_tokens(bases: Sequence[str], given: Sequence[str]) -> list[str]:
    """The recipes ``--ablate`` adds: each base and its variants, those not ``given`` already."""
    from megatron.quant.recipes import ablations

    tokens: list[str] = []
    for base in bases:
        try:
            expanded = ablations.ablation(base)
        except ablations.AblationError as error:
            raise SweepError(str(error)) from error
        tokens += [token for token in expanded if token not in given and token not in tokens]
    return tokens


def check_schedules(runs: Sequence[SweepRun], train_iters: int) -> dict[str, list[str]]:
    """SweepError, before any run starts, for a recipe whose schedule cannot run in ``train_iters``
    iterations (a switch past the end, overlapping phases): what each run's trainer would refuse.
    The phases of each scheduled run, one line each with its iterations (for its run.json)."""
    from megatron.quant.recipes.recipe import QuantRecipe, RecipeError

    phases = {}
    for run in runs:
        try:
            recipe = QuantRecipe.from_env(dict(run.env))
            if recipe.schedule:
                bound = recipe.schedule.bind(train_iters, f"run {run.name}")
                phases[run.name] = [f"phase {i}: {phase.describe()} (iterations {first}-{end - 1})" for i, (
                    phase, (first, end)) in enumerate(zip(bound.phases, bound.spans()), start=1)] + (
                    [f"evaluation: {bound.evaluation.name}"] if bound.evaluation is not None else [])
        except RecipeError as error:
            raise SweepError(str(error)) from error
    return phases


def plan_runs(recipes: str, seeds: Sequence[int] = (), baseline: str | None = None,
              ablate: Sequence[str] = ()) -> list[SweepRun]:
    """The runs of a sweep, in order: one per recipe (``--ablate``'s after the given ones), then
    per extra seed one run of every recipe (of ``baseline`` only, when given)."""
    runs = []
    tokens = _recipe_tokens(recipes)
    for token in tokens + ablation_tokens(ablate, [t.lower() for t in tokens]):
        name, env = resolve_recipe(token)
        runs.append(SweepRun(name, token, tuple(sorted(env.items()))))
    if not runs:
        raise SweepError(f"no recipes in {recipes!r}; give e.g. \"bf16 mxfp8 mxfp4 nvfp4 hifp8\"")
    names = [run.name for run in runs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise SweepError(f"recipes {duplicates} are given twice (a recipe file's name equals another recipe)")
    if baseline is not None and baseline not in names:
        raise SweepError(f"baseline {baseline!r} is not one of the sweep's recipes: {', '.join(names)}")
    seeded = [run for run in runs if baseline is None or run.name == baseline]
    runs += [SweepRun(f"{run.name}{SEED_SUFFIX}{seed}", run.recipe, run.env, ("--seed", str(seed)))
             for seed in seeds for run in seeded]
    return runs


def check_flag_values(flags: Sequence[str], where: str = "training flags") -> argparse.Namespace:
    """The training flags parsed; SweepError with ``where`` and the parser's one line (the flag and
    its value, bounded), not the whole flag line."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parse_args(list(flags))
    except SystemExit as exit_:
        message = said.getvalue().strip().split(": error: ", 1)[-1].removesuffix(" (see --help)")
        raise SweepError(f"{where}: {message[:300]}" if where else message[:300]) from exit_


def check_flags(flags: Sequence[str]) -> argparse.Namespace:
    """Parse the training flags once (an error before any run starts) and refuse the per-run ones."""
    args = check_flag_values(flags)
    given = [f"--{key.replace('_', '-')}" for key in _OWN_FLAGS if vars(args)[key] is not None]
    if given:
        raise SweepError(f"the sweep sets {', '.join(given)} per run (OUTPUT_DIR/<recipe>/); drop them")
    try:  # once, before any run starts, not in every run's first step
        check_data(args.data_path)
    except ValueError as error:
        raise SweepError(str(error)) from error
    return args


def train_command(run: SweepRun, run_dir: Path, launcher: Sequence[str], flags: Sequence[str],
                  wandb: bool) -> list[str]:
    """The launcher running ``megatron.quant.training`` for ``run`` into ``run_dir``."""
    checkpoints = str(run_dir / CHECKPOINTS)
    own = ["--save", checkpoints, "--load", checkpoints, "--tensorboard-dir", str(run_dir / TENSORBOARD)]
    if wandb and "--wandb-exp-name" not in flags:
        own += ["--wandb-exp-name", run.name]
    return [*launcher, "-m", "megatron.quant.training", *flags, *run.extra_flags, *own]


def print_command(output_dir: Path, recipes: str, run: SweepRun, options: argparse.Namespace,
                  flags: Sequence[str]) -> str:
    """The sweep itself restricted to ``run`` (``--only``): a job-array line that keeps run.json,
    skip/resume and divergence handling."""
    argv = [sys.executable, "-m", "megatron.quant.lab.sweep", "--only", run.name,
            "--launcher", options.launcher]
    if options.seeds:
        argv += ["--seeds", " ".join(map(str, options.seeds))]
    if options.baseline:
        argv += ["--baseline", options.baseline]
    for base in options.ablate:
        argv += ["--ablate", base]
    return shlex.join([*argv, str(output_dir), recipes, "--", *flags])
