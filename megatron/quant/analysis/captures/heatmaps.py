"""heatmaps/: where the large magnitudes sit in a tensor (max |x| per block of a 2-D view).

Rows of the view are the leading dimensions flattened (tokens for activations, output
features for weights), columns the last dimension (features), so outlier channels show as
vertical stripes.
"""
from __future__ import annotations

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import group_by
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "heatmaps"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    with_maps = [s for s in inp.originals if s.heatmap is not None]
    groups = group_by(with_maps, lambda s: (s.record.quant_type, s.record.layer_type,
                                             s.record.operation))
    for (quant_type, layer_type, operation), items in groups.items():
        by_tensor = group_by(items, lambda s: s.record.tensor_key)  # every module's tensors, not one module's
        first = [min(captures, key=lambda s: (s.record.iteration, s.record.layer_idx,
                                              s.record.rank, s.record.sample))
                 for captures in by_tensor.values()]
        kept = plan.first_panels(f"heatmaps {quant_type} {layer_type} {operation}", first, inp.settings.max_panels)
        panels = [{"title": f"{s.record.role or layer_type} {s.record.phase} {s.record.tensor_name}, "
                            f"L{s.record.layer_idx} iter {s.record.iteration}\nshape {list(s.record.shape or ())}",
                   "grid": s.heatmap, "shape": s.record.shape} for s in kept]
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type, layer_type, operation),
            f"{quant_type}, {layer_type} {operation}: max |x| per block for the first capture of "
            f"each tensor of each module (log colour scale).", draw_heatmaps,
            {"title": f"{quant_type}: {layer_type} {operation}, max |x| per block",
             "panels": panels}))
    if not groups:
        plan.notes.append("No heatmap: no selected capture has a tensor of two or more "
                          "dimensions.")
    return plan


def draw_heatmaps(payload: dict) -> Figure:
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=3, panel_size=(3.9, 3.8))  # within the page's width
    for ax, panel in zip(axes, panels):
        grid = np.ma.masked_invalid(np.where(panel["grid"] > 0, panel["grid"], np.nan))
        ax.set_title(panel["title"], fontsize=9)
        if grid.count() == 0:
            figures.no_data(ax, "all zeros")
            continue
        low, high = float(grid.min()), float(grid.max())
        image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest",
                          norm=LogNorm(vmin=low, vmax=max(high, 2 * low)))
        shape = panel["shape"] or (grid.shape[0], grid.shape[1])
        rows = int(np.prod(shape[:-1]))
        ax.set_xlabel(f"column block (last dim, {shape[-1]} columns)")
        ax.set_ylabel(f"row block ({rows} rows)")
        figures.colour_bar(ax, image, "max |x| in block")
    return figures.finish(fig, payload["title"])
