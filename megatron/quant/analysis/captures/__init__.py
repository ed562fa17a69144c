"""The capture report (``python -m megatron.quant.analysis``): captures catalogued (``catalog``),
selected (``selection``), loaded and summarized (``loading``, ``summary``), analysed by the figure
families (``families``: one module each) and written by ``pipeline``."""
