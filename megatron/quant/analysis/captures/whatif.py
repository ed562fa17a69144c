"""whatif_analysis/: the captured operands' statistics under other formats than the run's
(``TENSOR_SAVE_WHATIF``, an inspect config's recipe-prefixed statistics), over training and per layer:
which format would underflow or overflow where."""
from __future__ import annotations

import math
from typing import Callable

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, median_curves
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "whatif_analysis"
# (field of a what-if entry, panel title, axis label, factor)
_METRICS = (("underflow_ratio", "Underflow", "underflow (% of elements)", 100.0),
            ("overflow_ratio", "Overflow", "overflow (% of elements)", 100.0),
            ("sqnr_db", "SQNR", "SQNR (dB)", 1.0))
_MIN_LAYERS = 3  # curves along fewer layers are flat pairs of points


def _whatif(summary: TensorSummary) -> dict:
    entries = (summary.record.stats or {}).get("whatif")
    return entries if isinstance(entries, dict) else {}


def _points(items: list[TensorSummary]) -> list[tuple[str, TensorSummary]]:
    """(what-if name, capture) for every what-if entry of every capture."""
    return [(name, s) for s in items for name in _whatif(s)]


def _value(name: str, summary: TensorSummary, key: str, factor: float) -> float:
    value = _whatif(summary)[name].get(key)
    return math.nan if value is None or not math.isfinite(value) else factor * float(value)


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    items = [s for s in inp.originals if _whatif(s)]
    if not items:
        plan.notes.append("No what-if statistics: set TENSOR_SAVE_WHATIF (e.g. mxfp8,te-nvfp4,hifp8) with "
                          "TENSOR_SAVE_MODE=stats, or ask an inspect config for recipe-prefixed statistics.")
        return plan
    for quant_type, group in group_by(items, lambda s: s.record.quant_type).items():
        points = _points(group)
        iterations = sorted({s.record.iteration for s in group})
        layers = sorted({s.record.layer_idx for s in group})
        axes = [("layer", lambda p: p[1].record.layer_idx)] if len(layers) >= _MIN_LAYERS else []
        if not axes:
            plan.notes.append(f"No what-if curves along the layers for {quant_type}: {len(layers)} layer(s); a line "
                              f"of fewer than {_MIN_LAYERS} points says no more than the figure over training.")
        if len(iterations) >= inp.settings.min_trend_iterations:
            axes.insert(0, ("iteration", lambda p: p[1].record.iteration))
        else:
            plan.notes.append(f"No what-if curves over training for {quant_type}: {len(iterations)} iteration(s); "
                              f"at least {inp.settings.min_trend_iterations} are needed (--min_trend_iterations).")
        for xlabel, x in axes:
            panels = [(title, ylabel, _curves(points, x, key, factor)) for key, title, ylabel, factor in _METRICS]
            over = "over training (median over layers, tensors and samples)" if xlabel == "iteration" else \
                "per layer (median over iterations, tensors and samples)"
            plan.figures.append(FigureJob(
                figure_path(FOLDER, quant_type, xlabel),
                f"{quant_type}: the captured GEMM operands under each what-if format, {over}.",
                draw_whatif, {"title": f"{quant_type}: what-if formats", "xlabel": xlabel, "panels": panels}))
    return plan


def _curves(points: list[tuple[str, TensorSummary]], x: Callable, key: str, factor: float) -> dict:
    return median_curves(points, lambda p: p[0], x, lambda p: _value(p[0], p[1], key, factor))


def draw_whatif(payload: dict) -> Figure:
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=3, panel_size=(5.2, 4.4), legend_width=3.4)
    for ax, (title, ylabel, curves) in zip(axes, panels):
        figures.line_panel(ax, curves, title, payload["xlabel"], ylabel, log=False if "SQNR" in ylabel else None,
                           legend=False)
    return figures.finish(fig, payload["title"], shared_legend=axes)
