"""comparisons/: the same tensor (layer type, pass, phase, name) across quant types."""
from __future__ import annotations

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, finite_median, group_by, sampled_series
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "comparisons"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    quant_types = sorted({s.record.quant_type for s in inp.with_values})
    if len(quant_types) < 2:
        plan.notes.append(f"Not drawn: comparing quant types needs captures of at least two; "
                          f"found {', '.join(quant_types) or 'none'}.")
        return plan
    by_tensor = group_by(inp.with_values, lambda s: s.record.tensor_key)
    shared = {key: items for key, items in by_tensor.items()
              if len({s.record.quant_type for s in items}) >= 2}
    if not shared:
        plan.notes.append("Not drawn: no tensor was captured under two quant types.")
        return plan
    per_pass = group_by(shared.items(), lambda kv: (kv[0].layer_type, kv[0].operation))
    for (layer_type, operation), entries in per_pass.items():
        kept = plan.first_panels(f"comparisons {layer_type} {operation}", entries, inp.settings.max_panels)
        budget = inp.settings.figure_budget // max(1, len(kept))
        panels = [{"title": " ".join(filter(None, (key.role, key.phase, key.tensor_name))),
                   "series": sampled_series(group_by(items, lambda s: s.record.quant_type),
                                            budget)}
                  for key, items in kept]
        plan.figures.append(FigureJob(
            figure_path(FOLDER, layer_type, operation),
            f"{layer_type} {operation}: each tensor's value distribution under every quant type.",
            figures.draw_histogram_panels,
            {"title": f"{layer_type} {operation}: tensors across quant types", "panels": panels}))
    categories = [key.label for key in shared]
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "std_absmax_by_quant_type"),
        "Median std and max |x| of each tensor under each quant type.", draw_magnitudes,
        {"categories": categories,
         "std": {qt: [_median(items, qt, "std") for items in shared.values()] for qt in quant_types},
         "absmax": {qt: [_median(items, qt, "absmax") for items in shared.values()]
                    for qt in quant_types}}))
    return plan


def _median(items: list[TensorSummary], quant_type: str, stat: str) -> float:
    return finite_median(s.stat(stat) for s in items if s.record.quant_type == quant_type)


def draw_magnitudes(payload: dict) -> Figure:
    fig, (std_ax, max_ax) = figures.subplot_grid(2, ncols=1, panel_size=(
        max(8.0, 0.6 * len(payload["categories"])), 4.5))
    figures.grouped_bars(std_ax, payload["categories"], payload["std"],
                         "Median standard deviation", "std (value units)")
    figures.grouped_bars(max_ax, payload["categories"], payload["absmax"],
                         "Median max |x|", "max |x| (value units)")
    return figures.finish(fig, "Tensor magnitudes by quant type")
