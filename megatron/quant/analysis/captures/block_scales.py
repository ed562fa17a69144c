"""block_scale_analysis/: how the block scales of block formats spread, per layer and over training
(the ``block_scales`` statistics stats-mode captures of block formats carry: capture/extras.py)."""
from __future__ import annotations

import math
from typing import Callable

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, median_curves, tensor_label
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "block_scale_analysis"
# (key in block_scales, panel title, axis label, factor)
_PER_LAYER = (("scale_log2_std", "Scale spread per layer", "std of log2 block scale (binades)", 1.0),
              ("at_floor", "Blocks at the scale floor", "blocks at floor (%)", 100.0),
              ("range_log2_max", "Widest block", "largest block range (log2 amax/amin)", 1.0))


def block_value(summary: TensorSummary, key: str, factor: float = 1.0) -> float:
    """A ``block_scales`` field of a capture times ``factor``; NaN where absent."""
    blocks = (summary.record.stats or {}).get("block_scales")
    value = blocks.get(key) if isinstance(blocks, dict) else None
    return math.nan if value is None else factor * float(value)


def _has_blocks(summary: TensorSummary) -> bool:
    return isinstance((summary.record.stats or {}).get("block_scales"), dict)


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    items = [s for s in inp.originals if _has_blocks(s)]
    if not items:
        plan.notes.append("No per-block statistics: they come with stats-mode captures (TENSOR_SAVE_MODE=stats, "
                          "TENSOR_SAVE_STATS sample or full) of operands in block formats (MXFP8, NVFP4, FP8 blocks).")
        return plan
    for quant_type, group in group_by(items, lambda s: s.record.quant_type).items():
        panels = [(title, "layer", label, _curves(group, _layer, key, factor))
                  for key, title, label, factor in _PER_LAYER]
        iterations = sorted({s.record.iteration for s in group})
        if len(iterations) >= inp.settings.min_trend_iterations:
            panels.insert(1, ("Scale spread over training", "iteration", "std of log2 block scale (binades)",
                              _curves(group, _iteration, "scale_log2_std", 1.0)))
        else:
            plan.notes.append(f"No scale spread over training for {quant_type}: per-block statistics for "
                              f"{len(iterations)} iteration(s); at least {inp.settings.min_trend_iterations} are "
                              f"needed (--min_trend_iterations).")
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type),
            f"{quant_type}: spread of the block scales (std of log2 scale, in binades), share of blocks whose scale "
            f"sits at the format's floor, widest block; per layer (median over iterations and samples) and over "
            f"training (median over layers).",
            draw_block_scales, {"title": f"{quant_type}: block scales", "panels": panels}))
    return plan


def _curves(items: list[TensorSummary], x: Callable[[TensorSummary], int], key: str, factor: float) -> dict:
    return median_curves(items, tensor_label, x, lambda s: block_value(s, key, factor))


def _layer(summary: TensorSummary) -> int:
    return summary.record.layer_idx


def _iteration(summary: TensorSummary) -> int:
    return summary.record.iteration


def draw_block_scales(payload: dict) -> Figure:
    panels = payload["panels"]
    labels = {label for *_, curves in panels for label in curves}
    many = len(labels) > figures.MAX_SERIES  # heatmaps, their values written in: no legend, the page's width
    fig, axes = figures.subplot_grid(len(panels), ncols=2, panel_size=(5.2, 4.4),
                                     legend_width=0.0 if many else figures.legend_width(sorted(labels)))
    for ax, (title, xlabel, ylabel, curves) in zip(axes, panels):
        figures.line_panel(ax, curves, title, xlabel, ylabel, legend=False)
    return figures.finish(fig, payload["title"], shared_legend=axes)
