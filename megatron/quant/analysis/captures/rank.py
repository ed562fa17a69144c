"""rank_analysis/: whether ranks see different magnitudes (tensor-parallel shards, data-parallel
batches), per rank and per tensor."""
from __future__ import annotations

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import finite_median, group_by
from megatron.quant.analysis.figure_budget import PAGE_WIDTH_IN
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "rank_analysis"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    by_rank = group_by(inp.originals, lambda s: s.record.rank)
    if len(by_rank) < 2:
        plan.notes.append(f"Not drawn: comparing ranks needs captures from at least two ranks; "
                          f"found rank(s) {', '.join(map(str, by_rank)) or 'none'}.")
        return plan
    labels = {rank: f"rank {rank}" for rank in by_rank}
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "rank_statistics"),
        "Captures per rank, and the per-capture std and max |x| on each rank.", draw_statistics,
        {"counts": {labels[r]: len(items) for r, items in by_rank.items()},
         "std": {labels[r]: [s.stat("std") for s in items] for r, items in by_rank.items()},
         "absmax": {labels[r]: [s.stat("absmax") for s in items] for r, items in by_rank.items()}}))
    by_tensor = group_by(inp.originals, lambda s: s.record.tensor_key)
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "rank_by_tensor"),
        "Median max |x| of each tensor on each rank.", draw_by_tensor,
        {"categories": [key.label for key in by_tensor],
         "groups": {labels[r]: [finite_median([s.stat("absmax") for s in items if s.record.rank == r])
                                for items in by_tensor.values()] for r in by_rank}}))
    return plan


def draw_statistics(payload: dict) -> Figure:
    boxes = max(len(payload["std"]), len(payload["absmax"]))
    size = figures.box_panel_size(boxes, (4.0, 4.2))
    fig, axes = figures.subplot_grid(3, ncols=3 if 3 * size[0] <= PAGE_WIDTH_IN else 1, panel_size=size)
    counts = payload["counts"]
    if not figures.one_value(axes[0], list(counts.values()), "captures per rank"):  # equal bars: one number
        axes[0].bar(list(counts), list(counts.values()))
        axes[0].set_ylabel("captures")
        axes[0].grid(alpha=0.3, axis="y")
    axes[0].set_title("Captures per rank", fontsize=10)
    figures.box_plot(axes[1], payload["std"], "Standard deviation per capture", "std (value units)")
    figures.box_plot(axes[2], payload["absmax"], "Max |x| per capture", "max |x| (value units)")
    return figures.finish(fig, "Captures by rank")


def draw_by_tensor(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(1, ncols=1, panel_size=(
        max(8.0, 0.6 * len(payload["categories"])), 4.6))
    figures.grouped_bars(axes[0], payload["categories"], payload["groups"],
                         "Median max |x| per tensor and rank", "max |x| (value units)")
    return figures.finish(fig, "Tensor magnitudes by rank")
