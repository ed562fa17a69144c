"""The study figure: does a recipe's final loss differ from the baseline's beyond the seeds' noise?

A forest plot, one row per recipe: its final-loss gap to the baseline (``seed_stats``: mean of
the last 10 % of training losses, averaged over seeds) with its one-std spread as a bar, and the
baseline's own seed spread shaded around zero (a gap outside the shade is *beyond noise*, the
recipe table's verdict). With the recipes' loss curves at hand, a second panel draws them with
only the baseline and the selected recipes (those beyond noise, else the best and the worst)
in colour. Drawn from the recipe table's rows, so ``recipes.csv`` alone is enough
(``draw_from_csv``).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from megatron.quant.analysis import figure_render, figures
from megatron.quant.analysis.plans import FigureJob

NAME = "study.png"
HIGHLIGHTED = 3  # recipes in colour on the loss panel besides the baseline
_NUMBERS = ("gap to baseline", "gap ±", "baseline seed spread")
_PAIRED = ("paired gap", "paired 95% ±")  # absent from tables written before paired gaps: drawn without them


def forest_job(recipes: Sequence[dict], baseline: str, curves: Optional[dict] = None,
               path: str = NAME) -> FigureJob:
    """The figure of ``recipes`` (the recipe table's rows, the baseline's among them); ``curves``:
    ``metrics.band_payload``'s ``loss`` (recipe -> iterations, mean, min, max, seeds) for the
    loss panel."""
    rows = [{"recipe": row["recipe"], "seeds": int(row["seeds"]), "beyond": row["beyond noise"],
             "beyond paired": row.get("beyond noise, paired"),
             **{key: _number(row[key]) for key in _NUMBERS}, **{key: _number(row.get(key)) for key in _PAIRED}}
            for row in recipes]
    rows = [row for row in rows if math.isfinite(row["gap to baseline"])]
    rows.sort(key=lambda row: row["gap to baseline"])
    payload = {"rows": rows, "baseline": baseline, "curves": curves or {},
               "highlighted": _highlighted(rows, baseline)}
    caption = (f"Final-loss gap of each recipe to {baseline} (dot: mean over seeds; bar: ± one std; shaded: "
               f"{baseline}'s own seed spread, outside it a gap is beyond noise; square: the paired gap to the "
               f"{baseline} run of the same seed, validation loss, with its 95 % interval)"
               + (", and the loss curves with the baseline and the selected recipes in colour" if curves else ""))
    return FigureJob(path, caption, draw_forest, payload)


def draw_from_csv(recipes_csv: Path, target: Path, baseline: str = "bf16", dpi: int = 100) -> figure_render.Drawn:
    """The forest plot of a saved recipe table (``recipes.csv``) into ``target``."""
    with open(recipes_csv, newline="") as handle:
        rows = [{**row, **{key: {"True": True, "False": False}.get(row.get(key) or "")
                           for key in ("beyond noise", "beyond noise, paired")}} for row in csv.DictReader(handle)]
    if not any(row["recipe"] == baseline for row in rows):
        raise ValueError(f"baseline {baseline!r} is not a recipe of {str(recipes_csv)!r}: "
                         f"{', '.join(row['recipe'] for row in rows)}")
    return figure_render.render(forest_job(rows, baseline, path=target.name), target.parent, dpi)


def draw_forest(payload: dict):
    rows, curves = payload["rows"], payload["curves"]
    height = max(3.6, 1.6 + 0.32 * len(rows))
    fig, axes = figures.subplot_grid(2 if curves else 1, ncols=2, panel_size=(6.2, height))
    _forest(axes[0], rows, payload["baseline"])
    if curves:
        _loss_panel(axes[1], curves, payload["baseline"], payload["highlighted"])
    others = [row for row in rows if row["recipe"] != payload["baseline"]]
    beyond = sum(bool(row["beyond"]) for row in others)
    paired = [row for row in others if row["beyond paired"] is not None]
    if paired:
        return figures.finish(fig, f"{len(rows)} recipes: {beyond} of {len(others)} beyond {payload['baseline']}'s "
                                   f"seed noise; {sum(bool(row['beyond paired']) for row in paired)} of {len(paired)} "
                                   "paired")
    return figures.finish(fig, f"{len(rows)} recipes: {beyond} of {len(others)} differ from {payload['baseline']} "
                               "beyond its seed noise")


def _forest(ax, rows: list[dict], baseline: str) -> None:
    noise = next((row["baseline seed spread"] for row in rows if math.isfinite(row["baseline seed spread"])), math.nan)
    if math.isfinite(noise):
        ax.axvspan(-100 * noise, 100 * noise, color="0.88", linewidth=0)
    ax.axvline(0, color="0.4", linewidth=0.8)
    positions = np.arange(len(rows))
    for y, row in zip(positions, rows):
        colour = "0.45" if row["recipe"] == baseline else ("C3" if row["beyond"] else "C0")
        spread = 100 * row["gap ±"] if math.isfinite(row["gap ±"]) else 0.0
        ax.errorbar(100 * row["gap to baseline"], y, xerr=spread, fmt="o", color=colour, markersize=5,
                    capsize=3, linewidth=1.4)
    paired = [(y, row) for y, row in zip(positions, rows) if math.isfinite(row["paired gap"])
              and row["recipe"] != baseline]
    for y, row in paired:
        colour = "C3" if row["beyond paired"] else "0.15"
        interval = 100 * row["paired 95% ±"] if math.isfinite(row["paired 95% ±"]) else 0.0
        ax.errorbar(100 * row["paired gap"], y + 0.22, xerr=interval, fmt="s", color=colour, markersize=4,
                    capsize=2, linewidth=1.0, label="paired, 95 %" if (y, row) == paired[0] else None)
    labels = [f"{row['recipe']} ({row['seeds']})" for row in rows]
    ax.set_yticks(positions, labels, fontsize=8)
    figures.room_for_row_names(ax, labels, 8)
    ax.set_ylim(len(rows) - 0.4, -0.6)  # the lowest gap on top
    ax.set_xlabel(f"final-loss gap to {baseline} (%)")
    ax.set_title(f"Final-loss gap, ± one std over seeds\n(shaded: {baseline} seed spread; red: beyond it)",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    if paired:
        figures.legend_above(ax)


def _loss_panel(ax, curves: dict, baseline: str, highlighted: list[str]) -> None:
    colours = dict(zip(highlighted, figures.series_colors(len(highlighted) + 1)[1:]))
    colours[baseline] = "k"
    for name, (steps, mean, _low, _high, _seeds) in curves.items():
        if name not in colours:
            ax.plot(steps, mean, color="0.8", linewidth=0.8, zorder=1)
    for name in [baseline, *highlighted]:
        if name in curves:
            steps, mean, low, high, seeds = curves[name]
            ax.fill_between(steps, low, high, color=colours[name], alpha=0.15, linewidth=0)
            ax.plot(steps, mean, color=colours[name], linewidth=1.4, label=f"{name} ({seeds} seeds)", zorder=2)
    losses = [v for _, mean, *_ in curves.values() for v in mean if np.isfinite(v)]
    if losses and min(losses) > 0 and figures.spans_decades(losses, 1.0):
        figures.log_scale(ax)
    ax.set(xlabel="iteration", ylabel="lm loss (smoothed, mean over seeds)")
    ax.set_title("Training loss (band: min-max over seeds; grey: the others)", fontsize=10)
    ax.grid(alpha=0.3)
    figures.legend_above(ax)


def _highlighted(rows: list[dict], baseline: str) -> list[str]:
    """The recipes worth a colour: beyond noise (largest gaps first), else the best and the worst."""
    others = [row for row in rows if row["recipe"] != baseline]
    beyond = sorted((row for row in others if row["beyond"]), key=lambda row: -abs(row["gap to baseline"]))
    chosen = beyond or ([others[0], others[-1]] if len(others) > 1 else others)
    return list(dict.fromkeys(row["recipe"] for row in chosen[:HIGHLIGHTED]))


def _number(value) -> float:
    """A table cell as a float: CSV text, None or an empty cell read as NaN."""
    if value is None or value == "":
        return math.nan
    return float(value)
