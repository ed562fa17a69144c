"""training_trends/: statistics over training iterations (needs several captured iterations;
statistics-only manifests make this cheap for long runs)."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, median_curves, tensor_label
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "training_trends"
# (metric, title, axis label, source, factor); source "stat" or "quant"
_METRICS = (("absmax", "Max |x|", "median max |x| (value units)", "stat", 1.0),
            ("std", "Standard deviation", "median std (value units)", "stat", 1.0),
            ("overflow_ratio", "Overflow", "overflow (% of elements)", "quant", 100.0),
            ("underflow_ratio", "Underflow", "underflow (% of elements)", "quant", 100.0),
            ("sqnr_db", "SQNR", "SQNR (dB)", "quant", 1.0))


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    needed = inp.settings.min_trend_iterations
    for quant_type, items in group_by(inp.originals, lambda s: s.record.quant_type).items():
        iterations = sorted({s.record.iteration for s in items})
        if len(iterations) < needed:
            plan.notes.append(f"No curves over training for {quant_type}: statistics for "
                              f"{len(iterations)} iteration(s) ({', '.join(map(str, iterations))});"
                              f" at least {needed} are needed (--min_trend_iterations).")
            continue
        curves = {metric: median_curves(items, tensor_label, _iteration,
                                        lambda s, m=metric, src=source, f=factor:
                                        f * (s.stat(m) if src == "stat" else s.quant_metric(m)))
                  for metric, _, _, source, factor in _METRICS}
        said = []  # a statistic of one value everywhere (no overflow at all) is said, not drawn
        for metric, _, ylabel, _, _ in _METRICS:
            values = {v for _, ys in curves[metric].values() for v in ys if np.isfinite(v)}
            if len(values) <= 1:
                said.append(f"{ylabel}: {values.pop():g} for every tensor and iteration" if values
                            else f"{ylabel}: not recorded")
                del curves[metric]
        if not curves:
            plan.notes.append(f"No curves over training for {quant_type}: {'; '.join(said)}.")
            continue
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type),
            f"{quant_type}: statistics of each tensor over {len(iterations)} iterations "
            f"({iterations[0]}..{iterations[-1]}; median over layers, ranks and samples)."
            + "".join(f" {text[0].upper()}{text[1:]}." for text in said),
            draw_trends, {"title": f"{quant_type}: statistics over training", "curves": curves}))
    return plan


def _iteration(summary: TensorSummary) -> int:
    return summary.record.iteration


def draw_trends(payload: dict) -> Figure:
    curves = payload["curves"]
    shown = [entry for entry in _METRICS if entry[0] in curves]
    labels = sorted({label for metric, *_ in shown for label in curves[metric]})
    many = len(labels) > figures.MAX_SERIES  # heatmaps, a row per tensor, need no legend but height
    fig, axes = figures.subplot_grid(len(shown), ncols=2, panel_size=(5.6, max(4.4, 1.4 + 0.15 * len(labels)) if many
                                                                       else 4.4),
                                     legend_width=0.0 if many else figures.legend_width(labels))
    for ax, (metric, title, ylabel, _, _) in zip(axes, shown):
        figures.line_panel(ax, curves[metric], title, "iteration", ylabel,
                           log=False if metric == "sqnr_db" else None, legend=False)
    return figures.finish(fig, payload["title"], shared_legend=axes)
