"""quantization_analysis/: how much each format changes each tensor (SQNR, relative MSE,
cosine similarity), and the original vs quantized values themselves."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, finite_median, group_by, subsample_indices
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "quantization_analysis"
MAX_PAIRS = 5000  # scatter points per quant type


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    measured = [s for s in inp.originals if s.quant is not None]
    if measured:
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "error_metrics"),
            f"Median SQNR, relative MSE and cosine similarity per tensor and quant type "
            f"({source_note(measured)}).", draw_error_metrics, metric_table(measured)))
    else:
        plan.notes.append(no_quant_stats_note())
    viewed = [s for s in inp.originals if s.format_view is not None and s.format_view.applied]
    if viewed:
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "original_vs_quantized"),
            "Original against fake-quantized values, and the relative error, on sampled rows "
            "(re-quantized with the capture's own format).", draw_pairs, value_pairs(viewed)))
    else:
        plan.notes.append("No original-vs-quantized plot: no selected capture names the format "
                          "it was quantized with, or the formats package is unavailable.")
    return plan


def no_quant_stats_note() -> str:
    return ("Not drawn: no quantization statistics. Captures of quantized GEMM operands carry "
            "them in the manifest; otherwise they are measured on sampled rows when the "
            "capture names its format and megatron.quant.formats is installed.")


def source_note(measured: list[TensorSummary]) -> str:
    sampled = sum(s.quant_source == "sampled rows" for s in measured)
    if not sampled:
        return "exact, computed by the saver"
    return f"{len(measured) - sampled} exact from the saver, {sampled} estimated on sampled rows"


def metric_table(measured: list[TensorSummary]) -> dict:
    by_tensor = group_by(measured, lambda s: s.record.tensor_key)
    quant_types = sorted({s.record.quant_type for s in measured})

    def medians(metric: str) -> dict[str, list[float]]:
        return {qt: [finite_median([s.quant_metric(metric) for s in items
                              if s.record.quant_type == qt]) for items in by_tensor.values()]
                for qt in quant_types}

    return {"categories": [key.label for key in by_tensor],
            "sqnr_db": medians("sqnr_db"), "rel_mse": medians("rel_mse"),
            "cosine": medians("cosine")}


def value_pairs(viewed: list[TensorSummary]) -> dict:
    pairs = {}
    for quant_type, items in group_by(viewed, lambda s: s.record.quant_type).items():
        x = np.concatenate([s.format_view.x_pairs for s in items])
        q = np.concatenate([s.format_view.q_pairs for s in items])
        picks = subsample_indices(x.size, MAX_PAIRS)
        x, q = x[picks], q[picks]
        pairs[quant_type] = {"x": x, "q": q, "formats": sorted({s.format_view.format_name
                                                                 for s in items})}
    return pairs


def draw_error_metrics(payload: dict) -> Figure:
    width = max(8.0, 0.6 * len(payload["categories"]))
    fig, axes = figures.subplot_grid(3, ncols=1, panel_size=(width, 4.2))
    figures.grouped_bars(axes[0], payload["categories"], payload["sqnr_db"],
                         "Signal to quantization noise ratio (higher is better)", "SQNR (dB)",
                         log=False)
    figures.grouped_bars(axes[1], payload["categories"], payload["rel_mse"],
                         "Relative mean squared error (lower is better)",
                         "sum((q-x)^2) / sum(x^2)", log=True)
    # cosines of good formats all round to 1.0 on a 0-1 axis: their distance from 1, in decades, differs
    figures.grouped_bars(axes[2], payload["categories"],
                         {group: [1 - c for c in values] for group, values in payload["cosine"].items()},
                         "Angle between x and q: 1 - cosine similarity (lower is better)", "1 - cos(x, q)",
                         log=True)
    return figures.finish(fig, "Quantization error by tensor and quant type")


def draw_pairs(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(2 * len(payload), ncols=2, panel_size=(5.8, 4.4))
    for i, (quant_type, pair) in enumerate(payload.items()):
        x, q = pair["x"], pair["q"]
        scatter_ax, error_ax = axes[2 * i], axes[2 * i + 1]
        formats = ", ".join(pair["formats"])
        figures.scatter_against_diagonal(scatter_ax, x, q, f"{quant_type} ({formats}): quantized vs original",
                                         "original value x", "quantized value q", "q = x", "sampled elements")
        nonzero = (x != 0) & np.isfinite(x) & np.isfinite(q)
        relative = np.abs(q[nonzero] - x[nonzero]) / np.abs(x[nonzero])
        error_ax.set_title(f"{quant_type}: relative error |q - x| / |x|", fontsize=10)
        positive = relative[relative > 0]
        if positive.size:
            error_ax.hist(np.log10(positive), bins=60)
            error_ax.set_xlabel("log10 relative error")
            error_ax.set_ylabel(f"count ({(relative == 0).sum()} exact of {relative.size})")
            error_ax.grid(alpha=0.3)
        else:
            figures.no_data(error_ax, "every sampled element is exact")
    return figures.finish(fig, "Original vs fake-quantized values")
