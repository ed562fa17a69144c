"""The environment variables megatron.quant reads, named once: the recipe's ``CUSTOM_QUANT_*`` with
what each decides (``RECIPE_VARIABLES``; ``recipes.parse``, ``kernels.select``, ``layers.fusions``
and the run configuration derive their names from it), the prefixes the capture's ``TENSOR_SAVE_*``
and the inspect config use, and the launcher's variables. ``settings.environment`` is the one reader."""
from __future__ import annotations

KERNELS_ENV = "CUSTOM_QUANT_KERNELS"  # auto | torch | compile | triton
FUSIONS_ENV = "CUSTOM_QUANT_FUSIONS"  # auto | off

# name -> what it decides. "names": which recipe runs (a sweep sets it per run); "shapes": narrows the
# recipe CUSTOM_QUANT_* names (with precision flags or a precision file: a second choice, refused);
# "runs": how any recipe runs.
RECIPE_VARIABLES: dict[str, str] = {
    "CUSTOM_QUANT_TYPE": "names",       # a format or preset recipe for every quantized GEMM operand
    "CUSTOM_QUANT_SCOPE": "shapes",     # which GEMMs the format applies to (comma-separated scopes)
    "CUSTOM_QUANT_RECIPE": "names",     # a recipe file (YAML/JSON); the variables above fill what it omits
    "CUSTOM_QUANT_COMPILE": "runs",     # torch.compile the quantizers (on/off)
    KERNELS_ENV: "runs",                # which code quantizes (kernels.select)
    FUSIONS_ENV: "runs",                # the layers' fast paths (layers.fusions)
}
RECIPE_PREFIX = "CUSTOM_QUANT_"  # a variable with it that is not above is refused as a misspelling
CAPTURE_PREFIXES = ("TENSOR_SAVE_", "TENSOR_SAVER_", "TENSOR_INSPECT_")  # capture's (capture.config.ENV_VARS)
DIE_WITH_PARENT = "MEGATRON_QUANT_DIE_WITH_PARENT"  # set by the sweep for its runs' processes (training.lifetime)
