"""layer_analysis/: attention vs linear layers, statistics and format errors along the depth
of the model, and differences between samples (micro-batches)."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import (
    TensorSummary,
    group_by,
    log2_panels,
    median_curves,
    tensor_label,
)
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "layer_analysis"
_TREND_METRICS = (("overflow_ratio", "Overflow", "overflow (% of elements)", 100.0),
                  ("underflow_ratio", "Underflow", "underflow (% of elements)", 100.0),
                  ("sqnr_db", "SQNR", "SQNR (dB)", 1.0))


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    by_quant = list(group_by(inp.originals, lambda s: s.record.quant_type).items())
    kept = plan.first_panels("layer analysis quant types", by_quant, inp.settings.max_panels)
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "attention_vs_linear"),
        "Share of values per binade in attention and linear layers (all elements), per quant "
        "type.", figures.draw_log2_panels,
        {"title": "Attention vs linear layer magnitudes",
         "panels": log2_panels(((f"{qt}: attention vs linear", items) for qt, items in kept),
                               lambda s: s.record.layer_type)}))
    for quant_type, items in kept:
        passes = group_by(items, lambda s: (s.record.layer_type, s.record.operation))
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "per_layer_statistics", quant_type),
            f"{quant_type}: median max |x| and std of each tensor along the layers.",
            draw_per_layer,
            {"title": f"{quant_type}: tensor statistics along the layers",
             "panels": {f"{lt} {op}": {stat: median_curves(group, _short_tensor_label, _layer,
                                                           lambda s, st=stat: s.stat(st))
                                       for stat in ("absmax", "std")}
                        for (lt, op), group in passes.items()}}))
    _add_sample_analysis(plan, kept)
    _add_layer_trends(plan, kept)
    return plan


def _short_tensor_label(summary: TensorSummary) -> str:
    key = summary.record.tensor_key
    return " ".join(filter(None, (key.role, key.phase, key.tensor_name)))


def _layer(summary: TensorSummary) -> int:
    return summary.record.layer_idx


def _add_sample_analysis(plan: AnalysisPlan, by_quant: list) -> None:
    samples = {s.record.sample for _, items in by_quant for s in items}
    if len(samples) < 2:
        plan.notes.append(f"No sample analysis: it needs captures of at least two samples "
                          f"(micro-batches); found {len(samples)}.")
        return
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "samples"),
        "Per-capture max |x| for each sample (micro-batch), per quant type.", draw_samples,
        {qt: {f"sample {k}": [s.stat("absmax") for s in group]
              for k, group in group_by(items, lambda s: s.record.sample).items()}
         for qt, items in by_quant}))


def _add_layer_trends(plan: AnalysisPlan, by_quant: list) -> None:
    """Overflow, underflow and SQNR along the layers; a metric with one value everywhere (no overflow
    at all) is said in the caption, not drawn as an empty panel."""
    for quant_type, items in by_quant:
        measured = [s for s in items if s.quant is not None]
        if not measured:
            plan.notes.append(f"No layer trend for {quant_type}: its captures have no "
                              f"quantization statistics.")
            continue
        curves = {metric: median_curves(measured, tensor_label, _layer,
                                        lambda s, m=metric, f=factor: f * s.quant_metric(m))
                  for metric, _, _, factor in _TREND_METRICS}
        said = []
        for metric, _, ylabel, _ in _TREND_METRICS:
            values = {v for _, ys in curves[metric].values() for v in ys if np.isfinite(v)}
            if len(values) == 1:
                said.append(f"{ylabel}: {values.pop():g} for every tensor and layer")
                del curves[metric]
        if not curves:
            plan.notes.append(f"No layer trend for {quant_type}: {'; '.join(said)}.")
            continue
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "layer_trends", quant_type),
            f"{quant_type}: {', '.join(title.lower() for metric, title, _, _ in _TREND_METRICS if metric in curves)} "
            f"of each quantized tensor along the layers (median over iterations, ranks and samples)."
            + "".join(f" {text[0].upper()}{text[1:]}." for text in said), draw_layer_trends,
            {"title": f"{quant_type}: quantization along the layers", "curves": curves}))


def draw_per_layer(payload: dict) -> Figure:
    panels = payload["panels"]
    # a row per pass, max |x| beside std: two columns keep the figure within the page, its numbers readable
    fig, axes = figures.subplot_grid(2 * len(panels), ncols=2, panel_size=(5.8, 4.4))
    # one scale per statistic across the panels: activations and gradients lie decades apart
    log = {stat: figures.spans_decades([v for stats in panels.values() for _, ys in stats[stat].values() for v in ys],
                                       decades=1.0) for stat in ("absmax", "std")}
    for i, (name, stats) in enumerate(panels.items()):
        figures.line_panel(axes[2 * i], stats["absmax"], f"{name}: max |x| by layer",
                           "layer index", "median max |x| (value units)", log=log["absmax"])
        figures.line_panel(axes[2 * i + 1], stats["std"], f"{name}: std by layer",
                           "layer index", "median std (value units)", log=log["std"])
    return figures.finish(fig, payload["title"])


def draw_samples(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(len(payload), ncols=2, panel_size=(6.0, 4.4))
    for ax, (quant_type, series) in zip(axes, payload.items()):
        figures.box_plot(ax, series, f"{quant_type}: max |x| per capture by sample",
                         "max |x| (value units)")
    return figures.finish(fig, "Differences between samples (micro-batches)")


def draw_layer_trends(payload: dict) -> Figure:
    curves = payload["curves"]
    shown = [entry for entry in _TREND_METRICS if entry[0] in curves]
    labels = sorted({label for metric, *_ in shown for label in curves[metric]})
    fig, axes = figures.subplot_grid(len(shown), ncols=3, panel_size=(5.2, 4.4),
                                     legend_width=figures.legend_width(labels) if len(labels) <= figures.MAX_SERIES
                                     else 0.0)
    for ax, (metric, title, ylabel, _) in zip(axes, shown):
        figures.line_panel(ax, curves[metric], f"{title} by layer", "layer index",
                           ylabel, log=False if metric == "sqnr_db" else None, legend=False)
    return figures.finish(fig, payload["title"], shared_legend=axes)
