"""The run's configuration: every input of a training run, parsed once into one frozen, typed tree.

A run is configured from the command line (Megatron-LM's flags), the files the flags or variables
name (a precision file, a recipe file) and the environment: ``CUSTOM_QUANT_*`` (the recipe and how it
runs) and ``TENSOR_SAVE_*`` (capture), listed with what each decides in ``variables.VARIABLES``. One
rule, ``variables.PRECEDENCE``, decides between the sources. ``RunConfiguration`` holds the result;
``describe`` is the start line's ``configuration:`` line and ``record`` what each checkpoint keeps
(``run_config.json``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Optional

from megatron.quant.layers.fusions import FastPaths
from megatron.quant.recipes.parse import accumulate_override
from megatron.quant.recipes.precision import PrecisionConfig
from megatron.quant.recipes.precision_file import load_precision_file
from megatron.quant.recipes.presets import PrecisionFlags, emulates_precision, recipe_from_megatron_flags
from megatron.quant.recipes.recipe import QuantRecipe, check_env_names
from megatron.quant.settings.variables import COMPILE_ENV
from megatron.quant.tensor_saver import InspectPlan, SaverConfig, load_inspect_config, resolve_inspect
from megatron.quant.training.arguments import ArgumentError
from megatron.quant.training.run_tree import PrecisionSection, RunTree
from megatron.quant.training.variables import PRECEDENCE, RECIPE_CHOOSING


def _precision_files(flags: PrecisionSection) -> list[tuple[str, str]]:
    """The precision files given, as (Megatron-LM's flag, path)."""
    files = (("--kitchen-config-file", flags.kitchen_config_file),
             ("--te-precision-config-file", flags.te_precision_config_file))
    return [(flag, path) for flag, path in files if path]


def build_recipe(flags: PrecisionFlags, environ: Mapping[str, str]) -> QuantRecipe:
    """The recipe from Megatron-LM's precision flags (--fp8-recipe, --fp4-format, ...) or from
    CUSTOM_QUANT_*; both at once is an error, not a choice."""
    check_env_names(environ)
    flags_recipe = recipe_from_megatron_flags(flags)
    if flags_recipe is None:
        return QuantRecipe.from_env(environ)
    given = [key for key in RECIPE_CHOOSING if environ.get(key)]
    if given:
        raise ArgumentError(f"{', '.join(given)} and the precision flags (--fp8-recipe/--fp4-format) both choose "
                            f"the recipe ({flags_recipe['name']}); unset {', '.join(given)} or drop the flags")
    extra = {"compile": environ[COMPILE_ENV]} if environ.get(COMPILE_ENV) else {}
    return QuantRecipe.from_dict({**flags_recipe, **accumulate_override(environ)}, source="precision flags",
                                 defaults=extra)


def build_precision(tree: RunTree) -> PrecisionConfig:
    """The run's per-module precision (``PRECEDENCE``): a precision file, or the one recipe
    ``build_recipe`` gives every module, seeded by ``--seed`` where a recipe fixes no seed, its
    schedules placed in the run's ``--train-iters`` (a recipe that changes during the run)."""
    environ, seed = tree.environment.settings, tree.schedule.seed
    files = _precision_files(tree.precision)
    if not files:
        return PrecisionConfig.uniform(build_recipe(tree.precision, environ)).with_seed(seed).for_run(
            tree.schedule.train_iters, tree.model.num_layers)
    check_env_names(environ)
    others = [flag for flag, _ in files[1:]] + [key for key in RECIPE_CHOOSING if environ.get(key)]
    others += ["--fp8-recipe/--fp4-format"] if emulates_precision(tree.precision) else []
    flag, path = files[0]
    if others:
        raise ArgumentError(f"{flag} and {', '.join(others)} both choose the precision; give one")
    precision = load_precision_file(path, source=f"{flag} {path}").with_seed(seed)
    if accumulate_override(environ):  # CUSTOM_QUANT_ACCUMULATE=exact: every config, whatever it says
        precision = precision.with_exact_sums()
    return precision.for_run(tree.schedule.train_iters, tree.model.num_layers)


def precision_origin(tree: RunTree) -> str:
    """What chose the run's precision, as the user wrote it: the file flag, the precision flags or the variables."""
    files = _precision_files(tree.precision)
    if files:
        return " ".join(files[0])
    if emulates_precision(tree.precision):
        return "the precision flags (--fp8-recipe/--fp4-format)"
    environ = tree.environment.settings
    return ", ".join(f"{key}={environ[key]}" for key in RECIPE_CHOOSING if environ.get(key)) or "the default recipe"


def build_capture(inspect_config: Optional[str], environ: Mapping[str, str], precision: PrecisionConfig,
                  num_layers: int) -> tuple[SaverConfig, PrecisionConfig, Optional[InspectPlan]]:
    """TENSOR_SAVE_* and an nvdlfw-inspect config (``--tensor-inspect-config``, given as ``inspect_config``,
    or TENSOR_INSPECT_CONFIG): the capture settings, the precision with the config's disabled GEMMs, and
    the config's plan."""
    capture = SaverConfig.from_env(environ)
    if inspect_config:
        if capture.inspect is not None:
            raise ArgumentError("--tensor-inspect-config and TENSOR_INSPECT_CONFIG both give an inspect config; "
                                "give one")
        capture = replace(capture, inspect=load_inspect_config(inspect_config, "--tensor-inspect-config"))
    if capture.inspect is None:
        return capture, precision, None
    precision, plan = resolve_inspect(capture.inspect, precision, num_layers, capture.whatif)
    return capture, precision, plan


@dataclass(frozen=True)
class RunConfiguration:
    """What a run is made of, decided and checked before any process group exists."""

    tree: RunTree                   # the checked flags and variables, each with its source (run_tree)
    precision: PrecisionConfig      # the recipe of each module (one for all without a precision file)
    capture: SaverConfig            # TENSOR_SAVE_*
    fast_paths: FastPaths           # CUSTOM_QUANT_FUSIONS
    kernels: str                    # CUSTOM_QUANT_KERNELS: which code quantizes
    environment: tuple[tuple[str, str], ...]  # the VARIABLES that were set, as given
    shape: Mapping[str, Any]        # the model's shape (presets.SHAPE_KEYS, the padded vocabulary)
    tokenizer: Any
    inspect: Optional[InspectPlan] = None  # an nvdlfw-inspect config resolved against the run

    def describe(self) -> str:
        """The start line's ``configuration:`` line: where the precision and capture came from."""
        capture = f"capture to {self.capture.save_dir}" if self.capture.enabled else "capture off"
        if self.inspect is not None:
            capture += f" (inspect config {self.inspect.describe()})"
        set_vars = " ".join(f"{name}={value}" for name, value in self.environment) or "none"
        return (f"configuration: precision {self.precision.source} | {capture} | environment {set_vars} | "
                f"precedence: {PRECEDENCE}")

    def record(self) -> dict[str, Any]:
        """JSON-able: what each checkpoint keeps of the run (shape, quant_type and every flag, as before,
        plus the precision's matchers and recipes, the capture settings and the variables given)."""
        flags = {**self.tree.flags(), "notices": list(self.tree.notices)}
        return {"shape": dict(self.shape), "quant_type": self.precision.name, "args": flags,
                "precision": {"source": self.precision.source, "describe": self.precision.describe(),
                              "configs": {key: repr(recipe) for key, recipe in self.precision.configs.items()},
                              "schedules": self.precision.schedules()},
                "capture": asdict(self.capture), "kernels": self.kernels, "fusions": self.fast_paths.choice,
                "environment": dict(self.environment), "precedence": PRECEDENCE}
