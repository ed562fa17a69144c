"""overflow_analysis/: elements clipped at the format's max (upper) and flushed to zero
(lower), by quant type, layer type and tensor."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.quantization import no_quant_stats_note, source_note
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, tensor_label
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "overflow_analysis"


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    measured = [s for s in inp.originals if s.quant is not None
                and np.isfinite(s.quant_metric("overflow_ratio"))]
    if not measured:
        plan.notes.append(no_quant_stats_note())
        return plan
    by_quant = group_by(measured, lambda s: s.record.quant_type)
    by_layer_type = group_by(measured, lambda s: (s.record.quant_type, s.record.layer_type))
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "overflow_overview"),
        f"Overflow (|x| above the format's max after scaling) and underflow (nonzero x "
        f"quantized to 0), in % of elements ({source_note(measured)}).", draw_overview,
        {"by_quant": _shares(by_quant),
         "by_layer_type": _shares({f"{qt} {lt}": items for (qt, lt), items in by_layer_type.items()}),
         "points": {qt: (_percent(items, "overflow_ratio"), _percent(items, "underflow_ratio"))
                    for qt, items in by_quant.items()}}))
    kept = plan.first_panels("overflow by tensor", by_quant.items(), inp.settings.max_panels)
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "overflow_by_tensor"),
        "Overflow and underflow of each tensor, per quant type (% of all its elements).",
        draw_by_tensor,
        {qt: _shares(group_by(items, tensor_label)) for qt, items in kept}))
    return plan


def _percent(items: list[TensorSummary], metric: str) -> np.ndarray:
    return np.array([100 * s.quant_metric(metric) for s in items])


def _shares(groups: dict[str, list[TensorSummary]]) -> dict:
    """Element-weighted overflow/underflow % per labelled group: the share of all its elements."""
    def weighted(items: list[TensorSummary], metric: str) -> float:
        weights = np.array([s.stat("numel") for s in items])
        return float(100 * (weights * np.array([s.quant_metric(metric) for s in items])).sum()
                     / weights.sum())

    return {"categories": list(groups),
            "groups": {"overflow (upper)": [weighted(v, "overflow_ratio") for v in groups.values()],
                       "underflow (lower)": [weighted(v, "underflow_ratio")
                                             for v in groups.values()]}}


def draw_overview(payload: dict) -> Figure:
    """Bars of the shares (by quant type only when there are several; a share that is zero everywhere is
    named in the panel's title), the captures' upper against lower shares when some capture overflowed,
    and their totals: no empty bars, no panel of text."""
    bars = [(key, title) for key, title in (("by_quant", "By quant type"), ("by_layer_type", "By quant type and "
                                                                                            "layer type"))
            if key == "by_layer_type" or len(payload[key]["categories"]) > 1]
    overflowed = any(v for over, _ in payload["points"].values() for v in over)
    totals = {qt: over + under for qt, (over, under) in payload["points"].items()}
    positive = np.concatenate([t[t > 0] for t in totals.values()])
    drawn = len(bars) + overflowed + bool(positive.size)
    fig, axes = figures.subplot_grid(drawn, ncols=2, panel_size=(6.2, 4.4))
    for ax, (key, title) in zip(axes, bars):
        figures.grouped_bars(ax, payload[key]["categories"], payload[key]["groups"], title, "% of elements")
    rest = axes[len(bars):]
    if overflowed:
        _draw_upper_vs_lower(rest.pop(0), payload["points"])
    if positive.size:
        _draw_totals(rest.pop(0), totals, positive)
    return figures.finish(fig, "Overflow and underflow")


def _draw_totals(hist_ax, totals: dict, positive: np.ndarray) -> None:
    hist_ax.set_title("Total overflow + underflow per capture", fontsize=10)
    log = figures.spans_decades(positive, decades=1.0)
    low, high = float(positive.min()), float(positive.max()) * (1 + 1e-9)
    edges = (np.logspace(np.log10(low), np.log10(high), 40) if log
             else np.linspace(0, high, 40))
    for quant_type, total in totals.items():
        zeros = int((total == 0).sum())
        hist_ax.hist(total[total > 0], bins=edges, histtype="step", linewidth=1.4,
                     label=f"{quant_type} ({zeros} captures at 0%)")
    if log:
        figures.log_scale(hist_ax, "x")
    hist_ax.set_xlabel("overflow + underflow (% of elements" + (", log scale)" if log else ")"))
    hist_ax.set_ylabel("captures")
    hist_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    figures.legend_above(hist_ax)
    hist_ax.grid(alpha=0.3)


def _draw_upper_vs_lower(ax, points: dict) -> None:
    for quant_type, (over, under) in points.items():
        ax.plot(under, over, "o", markersize=4, alpha=0.6, label=quant_type)
    figures.log_scale(ax, "x", linthresh=1e-4)
    figures.log_scale(ax, "y", linthresh=1e-4)
    ax.set_xlim(left=0)  # shares are never negative
    ax.set_ylim(bottom=0)
    ax.set_xlabel("underflow (% of elements, symlog)")
    ax.set_ylabel("overflow (% of elements, symlog)")
    ax.set_title("Upper vs lower, one point per capture", fontsize=10)
    figures.legend_above(ax)
    ax.grid(alpha=0.3)


def draw_by_tensor(payload: dict) -> Figure:
    fig, axes = figures.subplot_grid(len(payload), ncols=1, panel_size=(
        max(8.0, 0.6 * max(len(p["categories"]) for p in payload.values())), 4.2))
    for ax, (quant_type, shares) in zip(axes, payload.items()):
        figures.grouped_bars(ax, shares["categories"], shares["groups"],
                             f"{quant_type}: overflow and underflow by tensor", "% of elements")
    return figures.finish(fig, "Overflow and underflow by tensor")
