"""Per-iteration aggregates of capture statistics, as flat scalars for logs and TensorBoard."""
from __future__ import annotations

import math
from collections import defaultdict

from megatron.quant.stats import key_names

# The record's iteration view (``stats.key_names``), averaged per (role, tensor name) over the iteration's
# captures; the what-if formats' (capture/extras.py) as whatif/<name>/<role>/<tensor>/<metric>, for the
# keys of that view a what-if record holds.
SUMMARY_METRICS = key_names(view="iteration")
WHATIF_METRICS = tuple(key for key in SUMMARY_METRICS if key in key_names(view="whatif"))


class IterationSummary:
    """Running sums of the metrics of one iteration; ``as_dict`` gives their means."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self.records = 0

    def add(self, role: str, tensor_name: str, stats: dict) -> None:
        self.records += 1
        self._add(f"quant/{role}/{tensor_name}", stats, SUMMARY_METRICS)
        for name, whatif in stats.get("whatif", {}).items():
            self._add(f"whatif/{name}/{role}/{tensor_name}", whatif, WHATIF_METRICS)

    def _add(self, prefix: str, stats: dict, metrics: tuple[str, ...]) -> None:
        for metric in metrics:
            value = stats.get(metric)
            if value is not None and math.isfinite(value):  # an exact quantization has no finite SQNR
                key = f"{prefix}/{metric}"
                self._sums[key] += value
                self._counts[key] += 1

    def as_dict(self) -> dict[str, float]:
        return {key: total / self._counts[key] for key, total in sorted(self._sums.items())}
