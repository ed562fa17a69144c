"""The study figure: does a recipe train as well as the baseline, beyond the seeds' noise?

A forest plot, one row per recipe, on two axes that measure two things:

- the **paired validation-loss gap** (``seed_stats.paired_gap``): each run against the baseline run of
  its seed, on the validation loss of the last evaluations, with the 95 % interval over the pairs
  (red where it leaves 0; a hollow square and "mixed" in the row's name where some pairs ran different
  code: ``seed_stats.mixed_pairs``);
- the **unpaired last-10 % training-loss gap**: the mean over seeds of each run's mean of its last 10 %
  of training losses, against the baseline's, with its one-std spread, and the baseline's own seed
  spread shaded around zero (outside the shade: *beyond noise*, the table's unpaired verdict).

Published numbers (``read_anchors``: a table of another study's gaps, e.g. Quartet-II's released runs)
are anchor rows on the paired panel: a grey diamond without an interval, named "published", on the
row of the recipe they match, or on a row of their own.

With the recipes' loss curves at hand, a third panel draws them with only the baseline and the
selected recipes (those beyond noise, else the best and the worst) in colour. Drawn from the recipe
table's rows, so ``recipes.csv`` alone is enough (``draw_from_csv``).
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
_COUNTS = ("paired pairs", "mixed pairs")


def read_anchors(path: Path) -> list[dict]:
    """Published gaps to draw beside ours: rows of ``published`` (the name), ``recipe`` (ours it matches,
    or empty), ``gap`` (relative) and ``parameters``; ValueError (one line) names a bad row."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    anchors = []
    for i, row in enumerate(rows, start=2):
        try:
            anchors.append({"published": row["published"].strip(), "recipe": (row.get("recipe") or "").strip(),
                            "gap": float(row["gap"]), "parameters": int(row["parameters"])})
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}: line {i}: expected published, recipe, gap and parameters ({error})") from error
        if not anchors[-1]["published"] or not math.isfinite(anchors[-1]["gap"]):
            raise ValueError(f"{path}: line {i}: a published row needs a name and a finite gap")
    return anchors


def forest_job(recipes: Sequence[dict], baseline: str, curves: Optional[dict] = None,
               path: str = NAME, anchors: Sequence[dict] = ()) -> FigureJob:
    """The figure of ``recipes`` (the recipe table's rows, the baseline's among them); ``curves``:
    ``metrics.band_payload``'s ``loss`` (recipe -> iterations, mean, min, max, seeds) for the
    loss panel."""
    rows = [{"recipe": row["recipe"], "seeds": int(row["seeds"]), "beyond": row["beyond noise"],
             "beyond paired": row.get("beyond noise, paired"),
             **{key: _number(row[key]) for key in _NUMBERS}, **{key: _number(row.get(key)) for key in _PAIRED},
             **{key: int(_number(row.get(key)) if math.isfinite(_number(row.get(key))) else 0) for key in _COUNTS}}
            for row in recipes]
    rows = [row for row in rows if math.isfinite(row["gap to baseline"])]
    rows.sort(key=lambda row: row["paired gap"] if math.isfinite(row["paired gap"]) else row["gap to baseline"])
    payload = {"rows": rows, "baseline": baseline, "curves": curves or {},
               "highlighted": _highlighted(rows, baseline), "anchors": list(anchors)}
    caption = (f"Each recipe against {baseline}, on two axes. Left: the paired validation-loss gap (square: mean over "
               f"seed pairs, each run against the {baseline} run of its seed; bar: 95 % interval; red: it leaves 0; "
               "hollow, 'mixed': some pairs ran different code). Middle: the unpaired gap of the last-10 % training "
               f"loss (dot: mean over seeds; bar: ± one std; shaded: {baseline}'s own seed spread)"
               + ("; right: the loss curves with the baseline and the selected recipes in colour" if curves else "")
               + ("; grey diamonds: published gaps (anchors), on their recipe's row or their own" if anchors else ""))
    return FigureJob(path, caption, draw_forest, payload)


def draw_from_csv(recipes_csv: Path, target: Path, baseline: str = "bf16", dpi: int = 100,
                  anchors: Optional[Path] = None) -> figure_render.Drawn:
    """The forest plot of a saved recipe table (``recipes.csv``) into ``target``, with the published
    rows of ``anchors`` (``read_anchors``) when given."""
    with open(recipes_csv, newline="") as handle:
        rows = [{**row, **{key: {"True": True, "False": False}.get(row.get(key) or "")
                           for key in ("beyond noise", "beyond noise, paired")}} for row in csv.DictReader(handle)]
    if not any(row["recipe"] == baseline for row in rows):
        raise ValueError(f"baseline {baseline!r} is not a recipe of {str(recipes_csv)!r}: "
                         f"{', '.join(row['recipe'] for row in rows)}")
    published = read_anchors(anchors) if anchors is not None else []
    return figure_render.render(forest_job(rows, baseline, path=target.name, anchors=published), target.parent, dpi)


def draw_forest(payload: dict):
    curves, baseline = payload["curves"], payload["baseline"]
    rows = _with_anchors(payload["rows"], payload.get("anchors", ()))
    paired = [row for row in rows if math.isfinite(row["paired gap"]) and row["recipe"] != baseline
              and not row.get("published")]
    height = max(3.6, 1.6 + 0.32 * len(rows))
    fig, axes = figures.subplot_grid(bool(paired) + 1 + bool(curves), ncols=3, panel_size=(5.6, height))
    labels = [_label(row, baseline) for row in rows]
    if paired:
        _paired_panel(axes[0], rows, labels, baseline)
    _unpaired_panel(axes[int(bool(paired))], rows, [""] * len(rows) if paired else labels, baseline)  # same rows
    if curves:
        _loss_panel(axes[-1], curves, baseline, payload["highlighted"])
    others = [row for row in rows if row["recipe"] != baseline and not row.get("published")]
    beyond = sum(bool(row["beyond"]) for row in others)
    if paired:
        mixed = sum(row["mixed pairs"] > 0 for row in paired)
        return figures.finish(fig, f"{len(others)} recipes against {baseline}: "
                                   f"{sum(bool(row['beyond paired']) for row in paired)} of {len(paired)} beyond noise "
                                   f"paired, {beyond} of {len(others)} unpaired"
                                   + (f"; {mixed} with mixed pairs" if mixed else ""))
    return figures.finish(fig, f"{len(rows)} recipes: {beyond} of {len(others)} differ from {baseline} "
                               "beyond its seed noise")


def _with_anchors(rows: list[dict], anchors: Sequence[dict]) -> list[dict]:
    """``rows`` with the anchors on them (``published``: the anchor matching the row's recipe) or as
    rows of their own, ordered by paired gap (the unpaired gap where no pair exists)."""
    ours = {row["recipe"] for row in rows}
    rows = [{**row, "anchor": next((a for a in anchors if a["recipe"] == row["recipe"]), None)} for row in rows]
    rows += [{"recipe": f"{a['published']} ({a['parameters'] / 1e6:.0f}M)", "seeds": 0, "published": True,
              "anchor": a, "paired gap": a["gap"], "gap to baseline": math.nan, "mixed pairs": 0, "paired pairs": 0}
             for a in anchors if a["recipe"] not in ours]
    return sorted(rows, key=lambda row: row["paired gap"] if math.isfinite(row["paired gap"])
                  else row["gap to baseline"])


def _label(row: dict, baseline: str) -> str:
    if row.get("published"):
        return f"{row['recipe']}, published"
    if row.get("anchor"):
        return f"{row['recipe']} ({row['seeds']} seeds; grey: published {row['anchor']['parameters'] / 1e6:.0f}M)"
    mixed = row["mixed pairs"] and row["recipe"] != baseline
    mixed = f", {row['mixed pairs']} of {row['paired pairs']} pairs mixed" if mixed else ""
    return f"{row['recipe']} ({row['seeds']} seeds{mixed})"


def _rows_axis(ax, labels: list[str], xlabel: str, title: str) -> None:
    ax.axvline(0, color="0.4", linewidth=0.8)
    ax.set_yticks(np.arange(len(labels)), labels, fontsize=8)
    if any(labels):
        figures.room_for_row_names(ax, labels, 8)
    ax.set_ylim(len(labels) - 0.4, -0.6)  # the lowest gap on top
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="x")


def _paired_panel(ax, rows: list[dict], labels: list[str], baseline: str) -> None:
    for y, row in enumerate(rows):
        if row.get("anchor"):
            ax.plot(100 * row["anchor"]["gap"], y - 0.25 * (not row.get("published")), "D", color="0.55", markersize=5)
        if row["recipe"] == baseline or not math.isfinite(row["paired gap"]) or row.get("published"):
            continue
        colour = "C3" if row["beyond paired"] else "0.15"
        interval = 100 * row["paired 95% ±"] if math.isfinite(row["paired 95% ±"]) else 0.0
        ax.errorbar(100 * row["paired gap"], y, xerr=interval, fmt="s", color=colour, markersize=5, capsize=3,
                    linewidth=1.2, markerfacecolor="white" if row["mixed pairs"] else colour)
    _rows_axis(ax, labels, f"paired validation-loss gap to {baseline} (%)",
               "Paired by seed: validation loss, 95 % interval\n(red: leaves 0; hollow: pairs of mixed code)")


def _unpaired_panel(ax, rows: list[dict], labels: list[str], baseline: str) -> None:
    noise = next((row["baseline seed spread"] for row in rows if math.isfinite(row["baseline seed spread"])), math.nan)
    if math.isfinite(noise):
        ax.axvspan(-100 * noise, 100 * noise, color="0.88", linewidth=0)
    for y, row in enumerate(rows):
        if row.get("published"):
            continue  # a published gap has no unpaired twin here
        colour = "0.45" if row["recipe"] == baseline else ("C3" if row["beyond"] else "C0")
        spread = 100 * row["gap ±"] if math.isfinite(row["gap ±"]) else 0.0
        ax.errorbar(100 * row["gap to baseline"], y, xerr=spread, fmt="o", color=colour, markersize=5,
                    capsize=3, linewidth=1.4)
    _rows_axis(ax, labels, f"last-10 % training-loss gap to {baseline} (%)",
               f"Unpaired: last-10 % training loss ± std\n(shaded: {baseline} seed spread; red: beyond)")


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
