"""The environment variables that choose how quantization runs, named once for the rooms that read
them: the kernel path (``kernels.select``), the layers' fast paths (``layers.fusions``), and the
recipes, which list every ``CUSTOM_QUANT_*`` name they accept (``recipes.parse.ENV_VARS``)."""
KERNELS_ENV = "CUSTOM_QUANT_KERNELS"  # auto | torch | compile | triton
FUSIONS_ENV = "CUSTOM_QUANT_FUSIONS"  # auto | off
