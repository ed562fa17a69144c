"""The runs comparison's figures: loss and gap curves, recipe bands over seeds, stats-mode capture
summaries (``figure_jobs``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from megatron.quant.analysis import figures
from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.runs.read import LOSS, GRAD_NORM, LR, TOKENS_PER_S, VALIDATION, STATS_TAG, Run
from megatron.quant.analysis.runs.metrics import GAP_THRESHOLDS, smooth, relative_gap


def _draw_bands(payload: dict):
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


# ---- figures --------------------------------------------------------------------------------
def _draw_loss(payload: dict):
    fig, (loss_ax, gap_ax) = figures.subplot_grid(2, ncols=2, panel_size=(7.0, 4.6),
                                                  legend_width=figures.legend_width(payload["loss"]))
    colors = dict(zip(payload["loss"], figures.series_colors(len(payload["loss"]))))
    for name, (steps, raw, smoothed) in payload["loss"].items():
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
        gap_ax.plot(steps, 100 * np.asarray(gap), color=colors.get(name, "0.3"), linewidth=1.4, label=name)
    for threshold in GAP_THRESHOLDS:
        gap_ax.axhline(100 * threshold, color="0.5", linestyle=":", linewidth=0.8)
    gap_ax.set(title=f"relative loss gap to {payload['baseline']} (smoothed)", xlabel="iteration",
               ylabel="gap (%)")
    for ax in (loss_ax, gap_ax):
        ax.grid(alpha=0.3)
    return figures.finish(fig, "Loss against the baseline", shared_legend=[loss_ax, gap_ax])


def _draw_lines(payload: dict):
    """One panel per entry of ``payload["panels"]`` ({title: {run: (x, y)}}), one line per run."""
    panels = payload["panels"]
    fig, axes = figures.subplot_grid(len(panels), ncols=payload.get("ncols", 3), panel_size=(5.0, 3.6),
                                     legend_width=1.6)
    for ax, (title, series) in zip(axes, panels.items()):
        ax.set_title(title, fontsize=10)
        values = [v for _, ys in series.values() for v in ys]
        for name, (xs, ys) in series.items():
            ax.plot(xs, ys, color=f"C{payload['colors'][name] % 10}", linewidth=1.2, label=name)
        if values and min(values) > 0 and figures.spans_decades(values):
            figures.log_scale(ax)
        ax.set(xlabel="iteration", ylabel=payload["ylabel"].get(title, title))
        ax.grid(alpha=0.3)
    return figures.finish(fig, payload["title"], shared_legend=axes)


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
    colors = {run.name: i for i, run in enumerate(curves)}
    loss = {run.name: (run.series(LOSS)[0].tolist(), run.series(LOSS)[1].tolist(),
                       smooth(run.series(LOSS)[1], smoothing).tolist()) for run in curves}
    gaps = {run.name: tuple(v.tolist() for v in relative_gap(run.series(LOSS), baseline.series(LOSS), smoothing))
            for run in curves}
    jobs = [FigureJob("loss.png", f"Training loss of every run (raw and smoothed) and its relative gap to "
                                  f"{baseline.name}" + (", with the band of its seed runs" if band else ""),
                      _draw_loss, {"loss": loss, "gap": gaps, "band": None if band is None else [b.tolist() for b in band],
                                   "baseline": baseline.name, "smoothing": smoothing})]
    training = {"grad norm": _lines(curves, GRAD_NORM), "learning rate": _lines(curves, LR),
                "tokens/s": _lines(curves, TOKENS_PER_S)}
    jobs.append(FigureJob("training.png", "Gradient norm, learning rate and throughput over training",
                          _draw_lines, {"panels": training, "title": "Training dynamics", "colors": colors,
                                        "ylabel": {}}))
    if any(run.series(VALIDATION)[0].size for run in curves):
        jobs.append(FigureJob("validation.png", "Validation loss", _draw_lines, {
            "panels": {"validation lm loss": _lines(curves, VALIDATION)}, "title": "Validation loss",
            "colors": colors, "ylabel": {}, "ncols": 1}))
    for metric, sites in stats_panels(curves).items():
        jobs.append(FigureJob(f"stats_{metric}.png", f"{metric} per role/operand over training (stats-mode "
                                                    "capture), one line per run", _draw_lines,
                              {"panels": sites, "title": metric, "colors": colors,
                               "ylabel": {site: metric for site in sites}, "ncols": 4}))
    return jobs
