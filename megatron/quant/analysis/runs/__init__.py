"""The runs comparison (``python -m megatron.quant.analysis runs``): training runs read from their
TensorBoard event files (``read``), compared to a baseline (``metrics``, ``seed_stats``), drawn
(``draw``) and written as HTML and CSV (``html``) by ``report``."""
