"""training_trends/: statistics over training iterations (needs several captured iterations;
statistics-only manifests make this cheap for long runs)."""
from __future__ import annotations

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
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type),
            f"{quant_type}: statistics of each tensor over {len(iterations)} iterations "
            f"({iterations[0]}..{iterations[-1]}; median over layers, ranks and samples).",
            draw_trends, {"title": f"{quant_type}: statistics over training", "curves": curves}))
    return plan


def _iteration(summary: TensorSummary) -> int:
    return summary.record.iteration


def draw_trends(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(len(_METRICS), ncols=3, panel_size=(5.2, 4.4),
                                     legend_width=3.4)
    for ax, (metric, title, ylabel, _, _) in zip(axes, _METRICS):
        figures.line_panel(ax, payload["curves"][metric], title, "iteration", ylabel,
                           log=False if metric == "sqnr_db" else None, legend=False)
    return figures.finish(fig, payload["title"], shared_legend=axes)
