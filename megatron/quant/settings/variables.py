"""The environment variables megatron.quant reads, named once: the recipe's ``CUSTOM_QUANT_*`` with
what each decides (``RECIPE_VARIABLES``; ``recipes.parse``, ``kernels.select``, ``layers.fusions``
and the run configuration derive their names from it), the prefixes the capture's ``TENSOR_SAVE_*``
and the inspect config use, and the launcher's variables. ``settings.environment`` is the one reader."""
from __future__ import annotations

TYPE_ENV = "CUSTOM_QUANT_TYPE"        # a format or preset recipe for every quantized GEMM operand
SCOPE_ENV = "CUSTOM_QUANT_SCOPE"      # which GEMMs the format applies to (comma-separated scopes)
RECIPE_ENV = "CUSTOM_QUANT_RECIPE"    # a recipe file (YAML/JSON); the variables above fill what it omits
COMPILE_ENV = "CUSTOM_QUANT_COMPILE"  # torch.compile the quantizers (on/off)
KERNELS_ENV = "CUSTOM_QUANT_KERNELS"  # auto | torch | compile | triton: which code quantizes (kernels.select)
FUSIONS_ENV = "CUSTOM_QUANT_FUSIONS"  # auto | off: the layers' fast paths (layers.fusions)
ACCUMULATE_ENV = "CUSTOM_QUANT_ACCUMULATE"  # te | exact: the recipe's accumulation, or exact FP32 sums everywhere

# name -> what it decides. "names": which recipe runs (a sweep sets it per run); "shapes": narrows the
# recipe CUSTOM_QUANT_* names (with precision flags or a precision file: a second choice, refused);
# "runs": how any recipe runs.
RECIPE_VARIABLES: dict[str, str] = {TYPE_ENV: "names", SCOPE_ENV: "shapes", RECIPE_ENV: "names",
                                     COMPILE_ENV: "runs", KERNELS_ENV: "runs", FUSIONS_ENV: "runs",
                                     ACCUMULATE_ENV: "runs"}
RECIPE_PREFIX = "CUSTOM_QUANT_"  # a variable with it that is not above is refused as a misspelling
CAPTURE_PREFIXES = ("TENSOR_SAVE_", "TENSOR_SAVER_", "TENSOR_INSPECT_")  # capture's (capture.config.ENV_VARS)
DIE_WITH_PARENT = "MEGATRON_QUANT_DIE_WITH_PARENT"  # set by the sweep for its runs' processes (training.lifetime)
