"""The environment variables a training run reads, what each decides, and the one precedence rule.

``VARIABLES`` is the one table: the recipe's variables (``settings.variables.RECIPE_VARIABLES``) and capture's
(``tensor_saver.ENV_VARS``), each with its role. The driver (which variables a second precision
choice conflicts with), the sweep (which ones a run's recipe replaces) and the run configuration
(which ones were given) derive their lists from it. Imports no megatron-core: the sweep reads it.
"""
from __future__ import annotations

from typing import Mapping

from megatron.quant.settings.variables import RECIPE_VARIABLES
from megatron.quant.tensor_saver import ENV_VARS as CAPTURE_VARIABLES

# What a variable decides: the recipe's roles (settings.variables) and "capture": what is captured.
VARIABLES: dict[str, str] = {**RECIPE_VARIABLES, **{name: "capture" for name in CAPTURE_VARIABLES}}
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
