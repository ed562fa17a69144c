"""What the analyses know about one capture: statistics and bounded samples, never the tensor.

A :class:`TensorSummary` is built once per capture in a worker process (loading.py) and is
small (a few thousand values), so thousands of them fit in memory and travel cheaply
between processes.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Optional, Sequence, TypeVar

import numpy as np

from megatron.quant.analysis.captures.catalog import CaptureRecord
from megatron.quant.stats import LOG2_EDGES, LOG2_LOW, NUMEL, key_names

# Histogram of log2|x| as in docs/interfaces.md section 3: bin 0 holds the nonzero values
# below 2**LOG2_LOW, bin k (1..60) holds 2**(LOG2_LOW+k-1) <= |x| < 2**(LOG2_LOW+k), the last
# bin those at or above 2**LOG2_HIGH. Zeros are counted apart (stats["zeros"]).
LOG2_BINS = len(LOG2_EDGES) + 1

T = TypeVar("T")

# The statistics a summary keeps of every capture: the record's summary view (``stats.key_names``), the
# tensor's element count first, and the shape moments estimated from the sampled values.
TENSOR_STATS = (NUMEL, *key_names("tensor", view="summary"))
QUANT_METRICS = key_names("quant", view="summary")
SAMPLE_MOMENTS = ("skewness", "kurtosis")


@dataclass(frozen=True)
class FormatView:
    """The capture seen through its number format, on block-preserving sampled rows.

    ``log2_counts[i]`` counts nonzero elements with floor(log2|x / scale|) == log2_start + i.
    """
    format_name: str
    applied: bool           # the layer applied this format (False: reference from the quant type)
    scaled: bool            # the format scales values (tensor or block) before its element grid
    max_value: float
    min_positive: float
    log2_start: int
    log2_counts: np.ndarray
    numel: int              # elements looked at (zeros included)
    overflow_share: float   # |x / scale| rounds beyond max (stats.quant_stats)
    underflow_share: float  # x != 0 and q == 0
    x_pairs: np.ndarray     # a few original values ...
    q_pairs: np.ndarray     # ... and what the format made of them


@dataclass(frozen=True)
class TensorSummary:
    record: CaptureRecord
    stats: Mapping[str, Any]               # section-3 tensor statistics of the whole tensor
    quant: Optional[Mapping[str, Any]]     # section-3 quantization statistics, if any
    quant_source: Optional[str]            # "saver" (manifest or file) or "sampled rows"
    log2_counts: Optional[np.ndarray]      # whole-tensor log2|x| histogram (LOG2_BINS counts)
    sample: Optional[np.ndarray]           # float32 values at indices fixed by numel
    heatmap: Optional[np.ndarray]          # max |x| per block of a 2-D view
    format_view: Optional[FormatView]

    @property
    def has_values(self) -> bool:
        return self.sample is not None and self.sample.size > 0

    def stat(self, name: str) -> float:
        """A statistic as a float; NaN when it is absent or undefined."""
        value = self.stats.get(name)
        return math.nan if value is None else float(value)

    def quant_metric(self, name: str) -> float:
        value = None if self.quant is None else self.quant.get(name)
        return math.nan if value is None else float(value)


def finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def finite_median(values: Iterable[float]) -> float:
    """Median of the finite values; NaN when there is none."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(kept)) if kept else math.nan


def group_by(items: Iterable[T], key: Callable[[T], Hashable]) -> dict[Hashable, list[T]]:
    """Groups in sorted key order (stable output file names and legends)."""
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return {k: groups[k] for k in sorted(groups, key=_sort_key)}


# Passes and phases in the order they happen, not alphabetically.
_NATURAL_ORDER = {"forward": "0", "backward": "1", "pre": "0", "post": "1"}


def _sort_key(key: Hashable) -> tuple:
    items = key if isinstance(key, tuple) else (key,)
    return tuple((0, item) if isinstance(item, (int, float)) and not isinstance(item, bool)
                 else (1, _NATURAL_ORDER.get(str(item), str(item))) for item in items)


def pooled_sample(summaries: Sequence[TensorSummary], budget: int) -> np.ndarray:
    """Finite sampled values of all ``summaries``, at most ``budget`` of them (deterministic)."""
    parts = [finite(s.sample) for s in summaries if s.has_values]
    if not parts:
        return np.empty(0, dtype=np.float32)
    return subsample(np.concatenate(parts), budget)


def subsample_indices(size: int, budget: int) -> np.ndarray:
    """Sorted distinct indices, at most ``budget`` of ``size``, the same for the same sizes."""
    if size <= budget:
        return np.arange(size)
    return np.sort(np.random.default_rng(size).choice(size, budget, replace=False))


def subsample(values: np.ndarray, budget: int) -> np.ndarray:
    return values[subsample_indices(values.size, budget)]


def sampled_series(groups: Mapping[str, Sequence[TensorSummary]], budget: int
                   ) -> dict[str, np.ndarray]:
    """Pooled samples per label; ``budget`` values in all, shared evenly between labels."""
    share = max(1, budget // max(1, len(groups)))
    series = {label: pooled_sample(items, share) for label, items in groups.items()}
    return {label: values for label, values in series.items() if values.size}


def median_curves(summaries: Iterable[TensorSummary], label: Callable[[TensorSummary], str],
                  x: Callable[[TensorSummary], float], value: Callable[[TensorSummary], float]
                  ) -> dict[str, tuple[list[float], list[float]]]:
    """Per label, the median ``value`` at each ``x`` (e.g. per tensor, over layers)."""
    curves = {}
    for name, items in group_by(summaries, label).items():
        points = group_by(items, x)
        ys = [finite_median(value(s) for s in group) for group in points.values()]
        if any(math.isfinite(y) for y in ys):
            curves[name] = (list(points), ys)
    return curves


def summed_log2_counts(summaries: Sequence[TensorSummary]) -> np.ndarray:
    """Whole-tensor log2|x| histograms added up (LOG2_BINS counts; bin 0 starts at LOG2_LOW - 1)."""
    total = np.zeros(LOG2_BINS, dtype=np.int64)
    for summary in summaries:
        if summary.log2_counts is not None:
            total += summary.log2_counts
    return total


def log2_histograms_by(summaries: Iterable[TensorSummary], key: Callable[[TensorSummary], Hashable]
                       ) -> dict[Hashable, tuple[int, np.ndarray]]:
    """Per group of ``key``: (first bin's binade, summed log2|x| counts), as figures.log2_panel takes."""
    return {group: (LOG2_LOW - 1, summed_log2_counts(items)) for group, items in group_by(summaries, key).items()}


def log2_panels(groups: Iterable[tuple[str, Iterable[TensorSummary]]], key: Callable[[TensorSummary], Hashable]
                ) -> list[dict]:
    """One panel per (title, summaries) of ``groups``: its ``log2_histograms_by(summaries, key)``, as
    figures.draw_log2_panels takes."""
    return [{"title": title, "histograms": log2_histograms_by(items, key)} for title, items in groups]


def pooled_moments(summaries: Sequence[TensorSummary]) -> dict[str, float]:
    """Exact numel, min, max, mean and std over the union of the tensors' finite elements."""
    rows = [(s.stat("numel") - s.stat("nans") - s.stat("infs"), s.stat("mean"), s.stat("std"),
             s.stat("min"), s.stat("max")) for s in summaries]
    rows = [r for r in rows if r[0] > 0 and all(math.isfinite(v) for v in r[1:])]
    total = sum(s.stat("numel") for s in summaries)
    if not rows:
        return {"numel": total, "min": math.nan, "max": math.nan, "mean": math.nan, "std": math.nan}
    counts = np.array([r[0] for r in rows])
    means = np.array([r[1] for r in rows])
    stds = np.array([r[2] for r in rows])
    mean = float((counts * means).sum() / counts.sum())
    second = float((counts * (stds ** 2 + means ** 2)).sum() / counts.sum())
    return {"numel": total, "min": min(r[3] for r in rows), "max": max(r[4] for r in rows),
            "mean": mean, "std": math.sqrt(max(second - mean * mean, 0.0))}


def tensor_label(summary: TensorSummary) -> str:
    return summary.record.tensor_key.label
