"""Tensor statistics: the packed layout and summation order (``packing``), the keys of a record
derived from it (``record``), the torch reference (``reference``: ``tensor_stats``,
``quant_stats``), and the capture levels (``levels``:
``capture_stats`` at counts, sample or full). Below ``kernels``, whose Triton statistics
(``kernels.stats``) produce ``packing``'s layout bit for bit.
"""
from .levels import (
           SAMPLE_ELEMENTS,
           STATS_LEVELS,
           capture_stats,
           exact_fields_from_counts,
           kernel_stats_serve,
           stats_from_packed,
)
from .packing import LOG2_EDGES, LOG2_LOW
from .record import GROUPS, scalar_names
from .reference import pack_stats, quant_stats, tensor_stats, unpack_stats

__all__ = ["GROUPS", "LOG2_EDGES", "LOG2_LOW", "SAMPLE_ELEMENTS", "STATS_LEVELS", "capture_stats",
           "exact_fields_from_counts", "kernel_stats_serve", "pack_stats", "quant_stats", "scalar_names",
           "stats_from_packed", "tensor_stats", "unpack_stats"]
