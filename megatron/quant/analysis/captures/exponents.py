"""exponent_analysis/: log2 of the magnitudes the format's element grid sees (|x| / scale for
scaled formats), against the format's representable range [min_positive, max_value], so the
share of values flushed to zero or clipped is visible at a glance."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import TensorSummary, group_by
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "exponent_analysis"
_MARGIN = 12  # binades shown beyond the occupied ones


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    viewed = [s for s in inp.originals if s.format_view is not None]
    if not viewed:
        plan.notes.append("Not drawn: no capture could be seen through a number format (the "
                          "captures name no format and their quant types are not format names, "
                          "or megatron.quant.formats is not installed).")
        return plan
    missing = sorted({s.record.quant_type for s in inp.originals} -
                     {s.record.quant_type for s in viewed})
    if missing:
        plan.notes.append(f"No exponent histogram for quant type(s) {', '.join(missing)}: no "
                          f"format is known for them.")
    for quant_type, items in group_by(viewed, lambda s: s.record.quant_type).items():
        # Formats the layers applied first, then the tensors that lose most (flushed or clipped): those
        # a reader looks for, whatever their names
        panels = sorted(((key, panel(key, group)) for key, group in group_by(
            items, lambda s: (not s.format_view.applied, s.record.tensor_key, s.format_view.format_name)).items()),
            key=lambda entry: (entry[0][0], -(entry[1]["underflow"] + entry[1]["overflow"])))
        kept = plan.first_panels(f"exponent histograms {quant_type} (the most flushed or clipped first)", panels,
                                 inp.settings.max_panels)
        plan.figures.append(FigureJob(
            figure_path(FOLDER, quant_type),
            f"{quant_type}: share of sampled values per binade of |x| / scale, with the format's "
            f"representable range marked; the legend gives the share flushed to zero and "
            f"clipped.", draw_exponents,
            {"title": f"{quant_type}: magnitudes against the format's range",
             "panels": [drawn for _, drawn in kept]}))
    return plan


def panel(key: tuple, items: list[TensorSummary]) -> dict:
    """Histograms of the captures added up on a common axis, and element-weighted shares."""
    not_applied, tensor_key, format_name = key
    views = [s.format_view for s in items]
    start = min(v.log2_start for v in views)
    counts = np.zeros(max(v.log2_start + v.log2_counts.size for v in views) - start, np.int64)
    for view in views:
        offset = view.log2_start - start
        counts[offset:offset + view.log2_counts.size] += view.log2_counts
    numel = sum(v.numel for v in views)
    first = views[0]
    return {"title": f"{tensor_key.label}\n{format_name}"
                     f"{' (reference, not applied)' if not_applied else ''}",
            "start": start, "counts": counts, "scaled": first.scaled,
            "max_value": first.max_value, "min_positive": first.min_positive,
            "underflow": sum(v.underflow_share * v.numel for v in views) / numel,
            "overflow": sum(v.overflow_share * v.numel for v in views) / numel,
            "captures": len(views), "numel": numel}


def draw_exponents(payload: dict) -> Figure:
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=3, panel_size=(5.4, 4.4))
    for ax, p in zip(axes, panels):
        low, high = math.log2(p["min_positive"]), math.log2(p["max_value"])
        label = f"{p['captures']} captures, {p['numel']:,} sampled values"
        occupied = figures.log2_histogram(ax, p["start"], p["counts"], label)
        ax.set_title(p["title"], fontsize=9)
        if occupied == (0, 0):
            figures.no_data(ax, "only zeros")
            continue
        # Show a range mark within _MARGIN binades of the data with room beyond it; one further off
        # (bf16's range spans 260 binades) is named in the legend, never zoomed out to.
        near_low, near_high = low >= occupied[0] - _MARGIN, high <= occupied[1] + _MARGIN
        left = min(occupied[0], math.floor(low)) - 2 if near_low else occupied[0] - 2
        right = max(occupied[1], math.ceil(high)) + 2 if near_high else occupied[1] + 2
        ax.set_xlim(left, right)
        for near, edge, beyond, colour, said in (
                (near_low, low, left, "tab:blue", f"below min positive 2^{low:.1f}: {100 * p['underflow']:.3g}% "
                                                  "flushed to 0"),
                (near_high, high, right, "tab:red", f"above max {p['max_value']:g}: {100 * p['overflow']:.3g}% "
                                                    "clipped")):
            if near:
                ax.axvspan(beyond, edge, color=colour, alpha=0.12, label=said)
                ax.axvline(edge, color=colour, linewidth=1)
            else:
                ax.plot([], [], color=colour, linewidth=1, label=f"{said} (2^{edge:.0f}, off the axis)")
        figures.log_scale(ax)
        ax.set_xlabel("log2(|x| / scale) (binade)" if p["scaled"] else "log2|x| (binade)")
        ax.set_ylabel("% of nonzero values (log scale)")
        figures.legend_above(ax)
        ax.grid(alpha=0.3)
    return figures.finish(fig, payload["title"])
