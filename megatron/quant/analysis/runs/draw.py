"""The runs comparison's figures: loss and gap curves, recipe bands over seeds, stats-mode capture
summaries (``figure_jobs``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from megatron.quant.analysis import figures
from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.runs.metrics import GAP_THRESHOLDS, relative_gap, smooth
from megatron.quant.analysis.runs.read import GRAD_NORM, LOSS, LR, STATS_TAG, TOKENS_PER_S, VALIDATION, Run


def draw_bands(payload: dict):
    if len(payload["loss"]) > figures.MAX_SERIES:
        return _draw_band_panels(payload)
    labels = [f"{name} ({entry[-1]} seeds)" for name, entry in payload["loss"].items()]
    fig, (loss_ax, gap_ax) = figures.subplot_grid(2, ncols=2, panel_size=(7.0, 4.6),
                                                  legend_width=figures.legend_width(labels))
    colors = figures.series_colors(len(labels))
    for color, label, (name, (steps, mean, low, high, _)) in zip(colors, labels, payload["loss"].items()):
        loss_ax.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
        loss_ax.plot(steps, mean, color=color, linewidth=1.4, label=label)
        steps, mean, low, high = payload["gap"][name]
        gap_ax.fill_between(steps, 100 * np.asarray(low), 100 * np.asarray(high), color=color, alpha=0.2,
                            linewidth=0)
        gap_ax.plot(steps, 100 * np.asarray(mean), color=color, linewidth=1.4)  # the legend: loss_ax's
    loss_ax.set(title=f"training loss over seeds (mean, band: min-max; smoothed {payload['smoothing']})",
                xlabel="iteration", ylabel="lm loss")
    gap_ax.set(title=f"gap to the mean of {payload['baseline']} (mean, band: min-max over seeds)",
               xlabel="iteration", ylabel="gap (%)")
    for ax in (loss_ax, gap_ax):
        ax.grid(alpha=0.3)
    return figures.finish(fig, "Recipes over seeds", shared_legend=[loss_ax, gap_ax])


def _draw_band_panels(payload: dict):
    """Too many recipes for one panel: one small panel per recipe, its gap to the baseline's mean
    (mean and min-max band over its seeds) over the baseline's own band, on a shared y axis."""
    baseline = payload["baseline"]
    names = [name for name in payload["gap"] if name != baseline]
    fig, axes = figures.subplot_grid(len(names), ncols=4, panel_size=(3.3, 2.6))
    everything = [100 * v for name in names for v in (*payload["gap"][name][2], *payload["gap"][name][3])]
    base = payload["gap"].get(baseline)
    for ax, name in zip(axes, names):
        if base is not None:
            ax.fill_between(base[0], 100 * np.asarray(base[2]), 100 * np.asarray(base[3]), color="0.85", linewidth=0)
        steps, mean, low, high = payload["gap"][name]
        ax.fill_between(steps, 100 * np.asarray(low), 100 * np.asarray(high), color="C0", alpha=0.3, linewidth=0)
        ax.plot(steps, 100 * np.asarray(mean), color="C0", linewidth=1.2)
        ax.axhline(0, color="0.4", linewidth=0.8)
        if everything:
            ax.set_ylim(min(everything), max(everything))
        ax.set_title(f"{name} ({payload['loss'][name][-1]} seeds)", fontsize=9)
        ax.set(xlabel="iteration", ylabel="gap (%)")
        ax.grid(alpha=0.3)
    return figures.finish(fig, f"Gap to the mean of {baseline} over seeds (blue: mean and min-max band; "
                               f"grey: {baseline}'s own seeds)")


# ---- figures --------------------------------------------------------------------------------
def _draw_loss(payload: dict):
    fig, (loss_ax, gap_ax) = figures.subplot_grid(2, ncols=2, panel_size=(7.0, 4.6),
                                                  legend_width=figures.legend_width(payload["loss"]))
    colors = _colours(payload["loss"], payload["highlighted"])
    for name, (steps, raw, smoothed) in payload["loss"].items():
        if name not in colors:  # beyond a readable number of lines: the others in grey, unnamed
            loss_ax.plot(steps, smoothed, color="0.8", linewidth=0.8, zorder=1)
            continue
        loss_ax.plot(steps, raw, color=colors[name], alpha=0.25, linewidth=0.8)
        loss_ax.plot(steps, smoothed, color=colors[name], linewidth=1.6, label=name)
    loss_ax.set(title=f"training loss (faint: raw, solid: smoothed {payload['smoothing']})",
                xlabel="iteration", ylabel="lm loss")
    losses = [v for _, raw, _ in payload["loss"].values() for v in raw]
    if losses and min(losses) > 0 and figures.spans_decades(losses, 1.0):
        figures.log_scale(loss_ax)  # a loss falling by decades: the late gaps stay visible
    band = payload["band"]
    if band is not None:
        gap_ax.fill_between(band[0], 100 * np.asarray(band[1]), 100 * np.asarray(band[2]), color="0.8",
                            label=f"{payload['baseline']} seed noise")
    for name, (steps, gap) in payload["gap"].items():
        if name in colors:
            gap_ax.plot(steps, 100 * np.asarray(gap), color=colors[name], linewidth=1.4, label=name)
        else:
            gap_ax.plot(steps, 100 * np.asarray(gap), color="0.8", linewidth=0.8, zorder=1)
    for threshold in GAP_THRESHOLDS:
        gap_ax.axhline(100 * threshold, color="0.5", linestyle=":", linewidth=0.8)
    gap_ax.set(title=f"relative loss gap to {payload['baseline']} (smoothed)", xlabel="iteration",
               ylabel="gap (%)")
    for ax in (loss_ax, gap_ax):
        ax.grid(alpha=0.3)
    return figures.finish(fig, "Loss against the baseline", shared_legend=[loss_ax, gap_ax])


def _draw_lines(payload: dict):
    """One panel per entry of ``payload["panels"]`` ({title: {run: (x, y)}}), one line per run.
    Panels of one metric (the stats figures: one y label for all) share their y axis, log when the
    values span decades; a few logged points are drawn as markers; a panel whose values are all
    the same says so in one line."""
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=payload.get("ncols", 3), panel_size=(5.0, 3.6),
                                     legend_width=figures.legend_width(payload["highlighted"]))
    colours = _colours(payload["runs"], payload["highlighted"])
    one_metric = len(set(payload["ylabel"].values())) == 1 and len(payload["ylabel"]) == len(panels)
    pooled = [v for series in panels.values() for _, ys in series.values() for v in ys if np.isfinite(v)]
    for ax, (title, series) in zip(axes, panels.items()):
        ax.set_title(title, fontsize=10)
        ylabel = payload["ylabel"].get(title, title)
        values = [v for _, ys in series.values() for v in ys if np.isfinite(v)]
        if figures.one_value(ax, values, ylabel):
            continue
        shown = pooled if one_metric else values
        few = max(len(xs) for xs, _ in series.values()) <= 5
        for name, (xs, ys) in series.items():
            style = {"marker": "o", "markersize": 4} if few else {}
            if name in colours:
                ax.plot(xs, ys, color=colours[name], linewidth=1.2, label=name, **style)
            else:
                ax.plot(xs, ys, color="0.8", linewidth=0.8, zorder=1, **style)
        if min(shown) > 0 and figures.spans_decades(shown):
            figures.log_scale(ax)
        else:
            figures.honest_limits(ax, shown)
            if one_metric:
                ax.set_ylim(*_padded(shown, ax.get_ylim()))
        ax.set(xlabel="iteration", ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return figures.finish(fig, payload["title"], shared_legend=axes)


def _padded(values, limits: tuple[float, float]) -> tuple[float, float]:
    """``limits`` widened to hold every one of ``values`` with a 5 % margin (a y axis shared by panels)."""
    low, high = min(min(values), limits[0]), max(max(values), limits[1])
    margin = 0.05 * (high - low)
    return low - margin, high + margin


def _colours(names, highlighted: Sequence[str]) -> dict:
    """A colour for each highlighted run (the others are drawn grey)."""
    chosen = [name for name in names if name in highlighted]
    return dict(zip(chosen, figures.series_colors(len(chosen))))


def highlighted_runs(curves: Sequence[Run], baseline: Run, smoothing: float) -> list[str]:
    """Every run when they fit one panel (``figures.MAX_SERIES``); else the baseline and the runs
    whose final gap to it is largest, the rest left grey."""
    if len(curves) <= figures.MAX_SERIES:
        return [run.name for run in curves]
    final = {run.name: abs(gap[-1]) if (gap := relative_gap(run.series(LOSS), baseline.series(LOSS),
                                                               smoothing)[1]).size else 0.0
             for run in curves if run is not baseline}
    return [baseline.name, *sorted(final, key=lambda name: -final[name])[:4]]


def _lines(runs: Sequence[Run], tag: str) -> dict[str, tuple[list, list]]:
    return {run.name: (run.series(tag)[0].tolist(), run.series(tag)[1].tolist())
            for run in runs if run.series(tag)[0].size}


def stats_panels(runs: Sequence[Run]) -> dict[str, dict[str, dict]]:
    """metric -> {"role/operand": {run: (x, y)}} from the stats-mode tags, whatever metrics exist."""
    out: dict[str, dict[str, dict]] = {}
    for run in runs:
        for tag, (steps, values) in run.scalars.items():
            match = STATS_TAG.match(tag)
            if match:
                out.setdefault(match["metric"], {}).setdefault(match["site"], {})[run.name] = (
                    steps.tolist(), values.tolist())
    return {metric: dict(sorted(sites.items())) for metric, sites in sorted(out.items())}


def figure_jobs(curves: Sequence[Run], baseline: Run, smoothing: float, band) -> list[FigureJob]:
    """``curves``: the runs drawn as lines (the baseline's seed runs only make the band)."""
    highlighted = highlighted_runs(curves, baseline, smoothing)
    shown = {"runs": [run.name for run in curves], "highlighted": highlighted}
    others = "" if len(highlighted) == len(curves) else (
        f" (in colour: {baseline.name} and the {len(highlighted) - 1} runs with the largest final gap; "
        f"grey: the other {len(curves) - len(highlighted)})")
    loss = {run.name: (run.series(LOSS)[0].tolist(), run.series(LOSS)[1].tolist(),
                       smooth(run.series(LOSS)[1], smoothing).tolist()) for run in curves}
    gaps = {run.name: tuple(v.tolist() for v in relative_gap(run.series(LOSS), baseline.series(LOSS), smoothing))
            for run in curves}
    jobs = [FigureJob("loss.png", f"Training loss of every run (raw and smoothed) and its relative gap to "
                                  f"{baseline.name}" + (", with the band of its seed runs" if band else "") + others,
                      _draw_loss, {"loss": loss, "gap": gaps,
                                   "band": None if band is None else [b.tolist() for b in band],
                                   "baseline": baseline.name, "smoothing": smoothing, **shown})]
    training = {title: lines for title, tag in (("grad norm", GRAD_NORM), ("learning rate", LR),
                                                ("tokens/s", TOKENS_PER_S)) if (lines := _lines(curves, tag))}
    if training:
        jobs.append(FigureJob("training.png", f"{', '.join(training).capitalize()} over training" + others,
                              _draw_lines, {"panels": training, "title": "Training dynamics", "ylabel": {}, **shown}))
    if any(run.series(VALIDATION)[0].size for run in curves):
        jobs.append(FigureJob("validation.png", "Validation loss" + others, _draw_lines, {
            "panels": {"validation lm loss": _lines(curves, VALIDATION)}, "title": "Validation loss",
            "ylabel": {}, "ncols": 1, **shown}))
    for metric, sites in stats_panels(curves).items():
        jobs.append(FigureJob(f"stats_{metric}.png", f"{metric} per role/operand over training (stats-mode "
                                                    "capture), one line per run" + others, _draw_lines,
                              {"panels": sites, "title": metric, "ylabel": {site: metric for site in sites},
                               "ncols": 4, **shown}))
    return jobs
