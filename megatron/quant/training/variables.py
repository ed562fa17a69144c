"""The environment variables a training run reads, what each decides, and the one precedence rule.

``VARIABLES`` is the one table: the recipe's variables (``recipes.parse.ENV_VARS``) and capture's
(``tensor_saver.ENV_VARS``), each with its role. The driver (which variables a second precision
choice conflicts with), the sweep (which ones a run's recipe replaces) and the run configuration
(which ones were given) derive their lists from it. Imports no megatron-core: the sweep reads it.
"""
from __future__ import annotations

from typing import Mapping

from megatron.quant.recipes.parse import ENV_VARS as RECIPE_VARIABLES
from megatron.quant.tensor_saver import ENV_VARS as CAPTURE_VARIABLES

# What a variable decides. "names": which recipe runs (a sweep sets it per run); "shapes": narrows the
# recipe CUSTOM_QUANT_* names (with precision flags or a precision file: a second choice, refused);
# "runs": how any recipe runs; "capture": what is captured.
_RECIPE_ROLES = {"CUSTOM_QUANT_TYPE": "names", "CUSTOM_QUANT_RECIPE": "names", "CUSTOM_QUANT_SCOPE": "shapes",
                 "CUSTOM_QUANT_COMPILE": "runs", "CUSTOM_QUANT_KERNELS": "runs", "CUSTOM_QUANT_FUSIONS": "runs"}
VARIABLES: dict[str, str] = {**{name: _RECIPE_ROLES[name] for name in RECIPE_VARIABLES},
                             **{name: "capture" for name in CAPTURE_VARIABLES}}
RECIPE_NAMING = tuple(name for name, role in VARIABLES.items() if role == "names")
RECIPE_CHOOSING = tuple(name for name, role in VARIABLES.items() if role in ("names", "shapes"))
PRECEDENCE = ("one source chooses the precision: a precision file (--kitchen-config-file or "
              "--te-precision-config-file), the precision flags (--fp8-recipe, --fp4-format) or "
              "CUSTOM_QUANT_TYPE/SCOPE/RECIPE, and two are refused; within CUSTOM_QUANT_*, a recipe file's keys "
              "win and the variables fill the keys it omits; CUSTOM_QUANT_COMPILE/KERNELS/FUSIONS apply to any "
              "source; TENSOR_SAVE_* configure capture, with one inspect config (--tensor-inspect-config or "
              "TENSOR_INSPECT_CONFIG, two are refused) choosing its layers, tensors and steps; the flags, "
              "everything else")


def environment_of(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The run's variables that ``environ`` sets (non-empty), in ``VARIABLES``' order."""
    return tuple((name, environ[name]) for name in VARIABLES if environ.get(name))
