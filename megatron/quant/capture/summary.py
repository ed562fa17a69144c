"""Per-iteration aggregates of capture statistics, as flat scalars for logs and TensorBoard."""
from __future__ import annotations

import math
from collections import defaultdict

# Quantization metrics averaged per (role, tensor name) over the iteration's captures.
SUMMARY_METRICS = ("overflow_ratio", "underflow_ratio", "sqnr_db", "rel_mse", "mse", "dynamic_range_log2")


class IterationSummary:
    """Running sums of the metrics of one iteration; ``as_dict`` gives their means."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self.records = 0

    def add(self, role: str, tensor_name: str, stats: dict) -> None:
        self.records += 1
        for metric in SUMMARY_METRICS:
            value = stats.get(metric)
            if value is not None and math.isfinite(value):  # an exact quantization has no finite SQNR
                key = f"quant/{role}/{tensor_name}/{metric}"
                self._sums[key] += value
                self._counts[key] += 1

    def as_dict(self) -> dict[str, float]:
        return {key: total / self._counts[key] for key, total in sorted(self._sums.items())}
