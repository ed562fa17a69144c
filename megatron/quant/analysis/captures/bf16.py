"""bf16_analysis/: the unquantized (bf16) baseline: raw and min-max normalised densities,
and the variance, skewness and kurtosis of each tensor."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, finite, group_by, subsample
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "bf16_analysis"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    members = [s for s in inp.with_values if s.record.quant_type.lower().startswith("bf16")]
    if not members:
        present = sorted({s.record.quant_type for s in inp.with_values})
        plan.notes.append(f"Not drawn: no bf16 captures selected (quant types present: "
                          f"{', '.join(present) or 'none'}).")
        return plan
    by_tensor = list(group_by(members, lambda s: s.record.tensor_key).items())
    kept = plan.first_panels("bf16 tensors", by_tensor, inp.settings.max_panels)
    share = max(1, inp.settings.figure_budget // len(kept))
    raw = {k.label: subsample(np.concatenate([finite(s.sample) for s in v]), share)
           for k, v in kept}
    normalised = {k.label: subsample(np.concatenate([_min_max(s) for s in v]), share)
                  for k, v in kept}
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "bf16_distributions"),
        "bf16 tensors: density of the raw values, and of the values scaled to [0, 1] by each "
        "capture's exact min and max.", draw_distributions, {"raw": raw, "normalised": normalised}))
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "bf16_moments"),
        "Per-capture variance (exact), skewness and excess kurtosis (from sampled values).",
        figures.draw_box_plot_panels,
        {"title": "bf16 tensor moments", "ncols": 3, "panel_size": (5.4, 4.4),
         "panels": [{"title": f"{title} per capture", "ylabel": ylabel, "log": log,
                     "series": {k.label: np.array([_moment(s, name) for s in v]) for k, v in kept}}
                    for name, title, ylabel, log in (
                        ("variance", "Variance", "variance (value units squared)", None),
                        ("skewness", "Skewness", "skewness (dimensionless)", False),
                        ("kurtosis", "Excess kurtosis", "excess kurtosis (dimensionless)", False))]}))
    return plan


def _min_max(summary: TensorSummary) -> np.ndarray:
    low, high = summary.stat("min"), summary.stat("max")
    values = finite(summary.sample)
    if not np.isfinite(low) or not np.isfinite(high) or high == low:
        return np.empty(0, dtype=np.float32)
    return (values - low) / (high - low)


def _moment(summary: TensorSummary, name: str) -> float:
    if name == "variance":
        return summary.stat("std") ** 2
    return summary.stat(name)


def draw_distributions(payload: dict) -> Figure:
    fig, (raw_ax, norm_ax) = figures.subplot_grid(2, ncols=2, panel_size=(6.4, 4.6))
    figures.value_histograms(raw_ax, payload["raw"], "Raw density")
    figures.value_histograms(norm_ax, payload["normalised"], "Min-max normalised density",
                             xlabel="(x - min) / (max - min)")
    return figures.finish(fig, "bf16 value distributions")


