"""backward_analysis/: forward vs backward tensors; gradients live many binades below
activations, so the comparison is drawn on log2|x|."""
from __future__ import annotations

from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import group_by, log2_panels, tensor_label
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "backward_analysis"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    operations = {s.record.operation for s in inp.originals}
    if "backward" not in operations:
        plan.notes.append(f"Not drawn: no backward captures selected (operations present: "
                          f"{', '.join(sorted(operations)) or 'none'}).")
        return plan
    by_layer_type = group_by(inp.originals, lambda s: s.record.layer_type)
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "forward_vs_backward"),
        "Share of values per binade (all elements of every capture) in the forward and the "
        "backward pass, per layer type.", figures.draw_log2_panels,
        {"title": "Forward vs backward magnitudes",
         "panels": log2_panels(((f"{layer_type} layers", items) for layer_type, items in by_layer_type.items()),
                               lambda s: s.record.operation)}))
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "backward_statistics"),
        "Per-capture std of every forward and backward tensor (a box when its values spread, else the values; "
        "max |x| per tensor is in statistics/absmax_by_tensor).", draw_statistics,
        {"std": {key.label: [s.stat("std") for s in items]
                 for key, items in group_by(inp.originals, lambda s: s.record.tensor_key).items()}}))
    gradients = [s for s in inp.originals if s.record.operation == "backward"]
    by_quant = list(group_by(gradients, lambda s: s.record.quant_type).items())
    kept = plan.first_panels("gradient distributions", by_quant, inp.settings.max_panels)
    if kept:  # magnitudes in binades: gradients span decades, one linear value axis would show few of them
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "gradient_distributions"),
            "Magnitudes of the backward-pass tensors, per quant type: the share of each tensor's values "
            "per binade of |x| (all elements of every capture).", figures.draw_log2_panels,
            {"title": "Backward-pass tensors", "panels": log2_panels(kept, tensor_label)}))
    return plan


def draw_statistics(payload: dict) -> Figure:
    series = payload["std"]
    size = figures.box_panel_size(len(series), (max(8.0, 0.5 * len(series)), 4.6))
    fig, [ax] = figures.subplot_grid(1, ncols=1, panel_size=size)
    figures.box_plot(ax, series, "Standard deviation per capture", "std (value units)")
    return figures.finish(fig, "Forward and backward tensor statistics")
