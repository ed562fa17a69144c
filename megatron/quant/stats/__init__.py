"""Tensor statistics: the schema, every field, key and per-block statistic declared once (``record``),
the packed layout and summation order derived from it (``packing``), the torch reference
(``reference``: ``tensor_stats``, ``quant_stats``), the capture levels (``levels``: ``capture_stats`` at
counts, sample or full), per-block statistics (``block_scales``) and TE's names of statistics
(``te_names``). Below ``kernels``, whose Triton statistics (``kernels.stats``) produce ``packing``'s
layout bit for bit.
"""
from .block_scales import block_scale_stats
from .levels import (
           SAMPLE_ELEMENTS,
           STATS_LEVELS,
           capture_stats,
           exact_fields_from_counts,
           kernel_stats_serve,
           stats_from_packed,
)
from .record import GROUPS, LOG2_EDGES, LOG2_LOW, NUMEL, block_key_names, key_names, scalar_names
from .reference import pack_stats, quant_stats, tensor_stats, unpack_stats
from .te_names import (
           TE_RECIPES,
           TE_STAT,
           TE_STATS,
           blockwise_name,
           fold,
           logged_name,
           max_blockwise_dynamic_range,
           parse_quantized_stat,
           stat_parts,
)

__all__ = ["GROUPS", "LOG2_EDGES", "LOG2_LOW", "NUMEL", "SAMPLE_ELEMENTS", "STATS_LEVELS", "TE_RECIPES", "TE_STAT",
           "TE_STATS", "block_key_names", "block_scale_stats", "blockwise_name", "capture_stats",
           "exact_fields_from_counts", "fold", "key_names", "kernel_stats_serve", "logged_name",
           "max_blockwise_dynamic_range", "pack_stats", "parse_quantized_stat", "quant_stats", "scalar_names",
           "stat_parts", "stats_from_packed", "tensor_stats", "unpack_stats"]
