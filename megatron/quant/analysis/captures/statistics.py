"""statistics/: per-capture statistics by quant type and by tensor, and a CSV of them all."""
from __future__ import annotations

import csv

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.quick import tensor_kind
from megatron.quant.analysis.captures.summary import (
    LOG2_BINS,
    LOG2_LOW,
    QUANT_METRICS,
    SAMPLE_MOMENTS,
    TENSOR_STATS,
    TensorSummary,
    group_by,
)
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, OutputFile, figure_path
from megatron.quant.stats import GROUPS, scalar_names

FOLDER = "statistics"
CSV_NAME = f"{FOLDER}/tensor_summary.csv"
_RECORD_COLUMNS = ("quant_type", "layer_type", "layer_idx", "role", "module", "operation", "phase",
                   "component", "tensor_name", "iteration", "microbatch", "sample", "rank",
                   "format_name", "dtype")
_STAT_COLUMNS = (*TENSOR_STATS, *SAMPLE_MOMENTS)


def build(inp: AnalysisInput) -> AnalysisPlan:
    summaries = inp.originals
    write_csv(inp, summaries)
    plan = AnalysisPlan(files=[OutputFile(CSV_NAME, "One row per capture: where it was taken "
                                                    "and its statistics (skewness and kurtosis "
                                                    "from the sampled values; then every other "
                                                    "statistic the capture recorded).")])
    by_quant = group_by(summaries, lambda s: s.record.quant_type)
    # weights, activations and gradients lie decades apart: one box of them all says nothing of either
    several = len(by_quant) > 1
    by_kind = group_by(summaries, lambda s: f"{s.record.quant_type} {tensor_kind(s)}" if several else tensor_kind(s))
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "statistics_by_quant_type"),
        "Distribution over captures of each tensor's offset (|mean| in units of its std), std, max |x| and share "
        "of zeros, per quant type and kind of tensor (a box when its values spread, else the values).",
        figures.draw_box_plot_panels,
        {"title": "Capture statistics by quant type and kind of tensor", "ncols": 2, "panel_size": (6.0, 4.2),
         "panels": [{"title": f"{title} per capture", "ylabel": ylabel, "log": log,
                     "series": {kind: _values(items, name) for kind, items in by_kind.items()}}
                    for name, title, ylabel, log in (
                        ("offset", "Offset |mean| / std", "|mean| / std", None),
                        ("std", "Standard deviation", "std (value units)", None),
                        ("absmax", "Max |x|", "max |x| (value units)", None),
                        ("zero_share", "Exact zeros", "zeros (% of elements)", False))]}))
    kept = plan.first_panels("statistics by tensor", by_quant.items(), inp.settings.max_panels)
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "absmax_by_tensor"),
        "Max |x| of each tensor over layers, iterations and ranks, per quant type.",
        draw_by_tensor,
        {qt: {key.label: _values(group, "absmax")
              for key, group in group_by(items, lambda s: s.record.tensor_key).items()}
         for qt, items in kept}))
    plan.figures += _block_scale_figure(summaries, inp)
    return plan


def _block_scale_figure(summaries: list[TensorSummary], inp: AnalysisInput) -> list[FigureJob]:
    """Histograms of the block scales the saver recorded (block formats), per quant type."""
    panels = {}
    for qt, items in group_by(summaries, lambda s: s.record.quant_type).items():
        histograms = {}
        for key, group in group_by(items, lambda s: s.record.tensor_key).items():
            counts = [(s.record.stats or {}).get("block_scale_hist") for s in group]
            counts = [c["counts"] for c in counts if c and len(c["counts"]) == LOG2_BINS]
            if counts:
                histograms[key.label] = (LOG2_LOW - 1, np.sum(counts, axis=0))
        if histograms:
            panels[qt] = histograms
    if not panels:
        return []
    kept = list(panels.items())[:inp.settings.max_panels]
    return [FigureJob(
        figure_path(FOLDER, "block_scales"),
        "Block scales chosen by block formats (MX, NVFP4): share of the blocks in each binade of "
        "the scale, over all captures of each tensor, per quant type (saver statistics; blocks "
        "holding a nonzero value; with TENSOR_SAVE_STATS=sample, over the sampled blocks).",
        figures.draw_log2_panels,
        {"title": "Block scale distribution", "xlabel": "log2 block scale (binade)",
         "panels": [{"title": qt, "histograms": histograms} for qt, histograms in kept]})]


def _values(items: list[TensorSummary], name: str) -> np.ndarray:
    if name == "zero_share":
        return np.array([100 * s.stat("zeros") / s.stat("numel") for s in items])
    if name == "offset":
        return np.array([abs(s.stat("mean")) / s.stat("std") if s.stat("std") else np.nan for s in items])
    return np.array([s.stat(name) for s in items])


def write_csv(inp: AnalysisInput, summaries: list[TensorSummary]) -> None:
    target = inp.output_dir / CSV_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    recorded = [key for key in scalar_names(*GROUPS)  # as the capture's manifest has them
                if key not in _STAT_COLUMNS and key not in QUANT_METRICS]
    with target.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["file", *_RECORD_COLUMNS, "shape", *_STAT_COLUMNS, *QUANT_METRICS, *recorded,
                         "quant_stats_source"])
        for s in summaries:
            r = s.record
            writer.writerow([
                "" if r.path is None else r.path.name,
                *(getattr(r, column) for column in _RECORD_COLUMNS),
                "x".join(map(str, r.shape)) if r.shape else "",
                *(s.stats.get(column) for column in _STAT_COLUMNS),
                *((s.quant or {}).get(metric) for metric in QUANT_METRICS),
                *((r.stats or {}).get(key) for key in recorded),
                s.quant_source or ""])




def draw_by_tensor(payload: dict) -> Figure:
    boxes = max(len(series) for series in payload.values())
    fig, axes = figures.subplot_grid(len(payload), ncols=2, panel_size=figures.box_panel_size(boxes, (7.0, 4.6)))
    for ax, (quant_type, series) in zip(axes, payload.items()):
        figures.box_plot(ax, series, f"{quant_type}: max |x| per capture", "max |x| (value units)")
    return figures.finish(fig, "Max |x| of each tensor by quant type")
