"""distributions/: histogram, box plot and normal Q-Q plot per quant type, layer type and pass."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import group_by, sampled_series
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "distributions"
_LINEAR_DECADES = 8.0  # magnitudes spanning more are drawn as log2 histograms


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    groups = group_by(inp.with_values, lambda s: (s.record.quant_type, s.record.layer_type,
                                                   s.record.operation))
    for (quant_type, layer_type, operation), items in groups.items():
        by_tensor = group_by(items, lambda s: f"{s.record.phase} {s.record.tensor_name}")
        payload = {"title": f"{quant_type}: {layer_type} {operation} tensors "
                            f"({len(items)} captures)",
                   "series": sampled_series(by_tensor, inp.settings.figure_budget)}
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type, layer_type, operation),
            f"{quant_type}, {layer_type} {operation}: value histogram, box plot and Q-Q plot "
            f"against a normal, per tensor.", draw_distribution, payload))
    if not groups:
        plan.notes.append("No tensor values to draw (only statistics-only captures selected).")
    return plan


def draw_distribution(payload: dict) -> Figure:
    fig, (hist_ax, box_ax, qq_ax) = figures.subplot_grid(3, ncols=3, panel_size=(5.5, 4.2))
    series = payload["series"]
    magnitudes = np.abs(np.concatenate([v[np.isfinite(v) & (v != 0)] for v in series.values()] or [np.empty(0)]))
    if figures.spans_decades(magnitudes, decades=_LINEAR_DECADES):  # e.g. 1e30 beside values of 1: on a linear
        # axis every value but the largest sits in one bin; the log2 magnitudes show them all
        decades = math.log10(magnitudes.max() / magnitudes.min())
        figures.log2_panel(hist_ax, {label: _log2_counts(v) for label, v in series.items()},
                           f"Magnitudes (sampled values, {decades:.0f} decades apart)")
    else:
        figures.value_histograms(hist_ax, series, "Histogram (sampled values)")
    figures.box_plot(box_ax, series, "Box plot (whiskers: 1st-99th percentile)", "value",
                     log=False)
    figures.qq_normal(qq_ax, series, "Q-Q plot against a normal")
    return figures.finish(fig, payload["title"])


def _log2_counts(values: np.ndarray) -> tuple[int, np.ndarray]:
    """(first binade, counts per binade) of the finite nonzero ``values``' log2 magnitudes."""
    values = values[np.isfinite(values) & (values != 0)]
    if not values.size:
        return 0, np.zeros(1)
    binades = np.floor(np.log2(np.abs(values.astype(np.float64)))).astype(np.int64)
    return int(binades.min()), np.bincount(binades - binades.min())
