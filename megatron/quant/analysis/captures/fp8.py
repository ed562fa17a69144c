"""fp8_analysis/: HiFP8 vs MXFP8 on the same tensors: distributions, statistics, element-wise
correlation of the same capture point, and how close each is to a normal distribution."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from megatron.quant.analysis import figures
from megatron.quant.analysis.captures.inputs import AnalysisInput
from megatron.quant.analysis.captures.summary import (
    TensorSummary,
    finite,
    group_by,
    pooled_sample,
    sampled_series,
    subsample_indices,
)
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, figure_path

FOLDER = "fp8_analysis"
FAMILIES = ("hifp8", "mxfp8")
MAX_POINTS = 4000  # scatter points per panel


def family(summary: TensorSummary) -> str | None:
    """"hifp8" or "mxfp8" when the quant type or the applied format is one of them."""
    for name in (summary.record.quant_type, summary.record.format_name or ""):
        for candidate in FAMILIES:
            if name.lower().startswith(candidate):
                return candidate
    return None


def build(inp: AnalysisInput) -> AnalysisPlan:
    plan = AnalysisPlan()
    members = group_by([s for s in inp.with_values if family(s)], family)
    if any(name not in members for name in FAMILIES):
        present = sorted({s.record.quant_type for s in inp.with_values})
        plan.notes.append(
            f"Not drawn: HiFP8 vs MXFP8 needs captures of both; found "
            f"{', '.join(f'{name}: {len(members.get(name, []))}' for name in FAMILIES)} "
            f"(quant types present: {', '.join(present) or 'none'}).")
        return plan
    settings = inp.settings
    by_tensor = group_by([s for items in members.values() for s in items],
                         lambda s: s.record.tensor_key)
    shared = [(key, items) for key, items in by_tensor.items()
              if {family(s) for s in items} == set(FAMILIES)]
    if shared:
        kept = plan.first_panels("HiFP8 vs MXFP8 distributions", shared, settings.max_panels)
        budget = settings.figure_budget // len(kept)
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "hifp8_vs_mxfp8_distributions"),
            "Value distributions of the tensors captured under both HiFP8 and MXFP8.",
            figures.draw_histogram_panels,
            {"title": "HiFP8 vs MXFP8 distributions",
             "panels": [{"title": key.label,
                         "series": sampled_series(group_by(items, family), budget)}
                        for key, items in kept]}))
    else:
        plan.notes.append("No distribution comparison: no tensor name was captured under both.")
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "hifp8_vs_mxfp8_statistics"),
        "Box plots over captures of each tensor's mean, std, min and max.", draw_statistics,
        {stat: {name: np.array([s.stat(stat) for s in items]) for name, items in members.items()}
         for stat in ("mean", "std", "min", "max")}))
    pairs = matched_pairs(members)
    if pairs:
        kept = plan.first_panels("HiFP8 vs MXFP8 correlation", pairs.items(), settings.max_panels)
        plan.figures.append(FigureJob(
            figure_path(FOLDER, "hifp8_vs_mxfp8_correlation"),
            "The same capture point (tensor, layer, iteration, rank, sample) under HiFP8 and "
            "MXFP8, element by element at the same sampled positions, with Pearson r.",
            draw_correlation, {"panels": [{"title": key.label, "x": x, "y": y}
                                          for key, (x, y) in kept]}))
    else:
        plan.notes.append("No correlation plot: no capture point was captured under both "
                          "HiFP8 and MXFP8 with the same shape.")
    plan.figures.append(FigureJob(
        figure_path(FOLDER, "hifp8_vs_mxfp8_normal_fit"),
        "Standardised values against a standard normal, with the Kolmogorov-Smirnov distance.",
        draw_normal_fit, {name: pooled_sample(items, settings.figure_budget // 2)
                          for name, items in members.items()}))
    return plan


def matched_pairs(members: dict) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per tensor, the sampled values of HiFP8/MXFP8 captures of the same point and shape."""
    mx = {(s.record.site_key, s.record.shape): s for s in members["mxfp8"]}
    matched = [(hi, mx[(hi.record.site_key, hi.record.shape)]) for hi in members["hifp8"]
               if (hi.record.site_key, hi.record.shape) in mx]
    pairs = {}
    for key, group in group_by(matched, lambda pair: pair[0].record.tensor_key).items():
        x = np.concatenate([hi.sample for hi, _ in group])
        y = np.concatenate([mx_.sample for _, mx_ in group])
        both = np.isfinite(x) & np.isfinite(y)
        x, y = x[both], y[both]
        picks = subsample_indices(x.size, MAX_POINTS)
        x, y = x[picks], y[picks]
        if x.size >= 2:
            pairs[key] = (x, y)
    return pairs


def draw_statistics(payload: dict) -> Figure:
    boxes = max(len(series) for series in payload.values())
    fig, axes = figures.subplot_grid(4, ncols=2, panel_size=figures.box_panel_size(boxes, (5.5, 4.0)))
    for ax, (stat, series) in zip(axes, payload.items()):
        figures.box_plot(ax, series, f"{stat} per capture", f"{stat} (value units)", log=False)
    return figures.finish(fig, "HiFP8 vs MXFP8: capture statistics")


def draw_correlation(payload: dict) -> Figure:
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=3, panel_size=(4.8, 4.4))
    for ax, panel in zip(axes, panels):
        x, y = panel["x"], panel["y"]
        r = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
        figures.scatter_against_diagonal(ax, x, y, f"{panel['title']} (r = {r:.4f}, n = {x.size})",
                                         "HiFP8 capture value", "MXFP8 capture value", "y = x")
    return figures.finish(fig, "HiFP8 vs MXFP8: same capture point, element by element")


def draw_normal_fit(payload: dict) -> Figure:
    import scipy.stats  # here only: importing it costs every report process a second
    fig, axes = figures.subplot_grid(len(payload), ncols=2, panel_size=(6.0, 4.4))
    grid = np.linspace(-5, 5, 400)
    for ax, (name, values) in zip(axes, payload.items()):
        values = finite(values).astype(np.float64)
        ax.set_title(name, fontsize=10)
        if values.size < 3 or values.std() == 0:
            figures.no_data(ax, "not enough varying values")
            continue
        z = (values - values.mean()) / values.std()
        distance = scipy.stats.kstest(z, "norm").statistic
        ax.hist(z, bins=np.linspace(-5, 5, 101), density=True, alpha=0.6,
                label=f"standardised values (n={z.size:,}; {np.mean(np.abs(z) > 5):.2%} "
                      f"beyond ±5)")
        ax.plot(grid, scipy.stats.norm.pdf(grid), "k-", label=f"N(0, 1); KS distance {distance:.3f}")
        figures.log_scale(ax)
        ax.set_xlabel("(x - mean) / std")
        ax.set_ylabel("probability density (log scale)")
        figures.legend_above(ax)
        ax.grid(alpha=0.3)
    return figures.finish(fig, "HiFP8 vs MXFP8: fit to a normal distribution")
