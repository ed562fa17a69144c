"""Compare training runs (e.g. a recipe sweep) from their TensorBoard event files.

``python -m megatron.quant.analysis runs OUTPUT_DIR [--output_dir REPORT_DIR] [--baseline bf16]``:
every subdirectory of OUTPUT_DIR holding event files (at any depth, e.g. ``NAME/tensorboard/``)
is one run named after the subdirectory; runs ``<recipe>-seed<N>`` are extra seeds of
``<recipe>``: the baseline's give the noise band, and every recipe with seeds gets a mean curve
with a min-max band and a row of the recipe table (``seed_stats``). Writes ``index.html``
(self-contained, links the PNGs beside it), ``runs.csv`` (one row per run) and, with seed runs,
``recipes.csv`` (one row per recipe).

Gaps are relative: ``loss_run / loss_baseline - 1`` at the iterations both logged. The gap at
the end and the first iteration above 1 % / 5 % use the smoothed losses (TensorBoard's debiased
exponential moving average, ``--smoothing``); the average over the last 10 % uses the raw ones.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import html
import json
import math
import re
import shlex
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from megatron.quant.analysis import figures, seed_stats
from megatron.quant.analysis.output_dir import OutputDirError, check_output_dir
from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.report import STYLE, figure_html, link, table

LOSS, GRAD_NORM, LR = "train/lm loss", "train/grad norm", "train/learning rate"
TOKENS_PER_S, VALIDATION, DIVERGED = "train/tokens/s", "validation/lm loss", "train/diverged"
# Stats-mode capture summaries: train/quant/<role>/<operand>/<metric> (any metric, present or future).
STATS_TAG = re.compile(r"^train/quant/(?P<site>.+)/(?P<metric>[^/]+)$")
GAP_THRESHOLDS = (0.01, 0.05)
LAST_SHARE = 0.1          # "the last 10 %" of the common iterations
SPIKE_FACTOR, SPIKE_WINDOW = 4.0, 50  # a grad-norm spike: above 4x the median of the previous 50
SEED_RUN = re.compile(r"^(?P<recipe>.+)-seed(?P<seed>\d+)$")  # the sweep's seed runs
EVENTS_GLOB = "events.out.tfevents.*"
CSV_NAME = "runs.csv"
RECIPES_CSV = "recipes.csv"


class RunsReportError(ValueError):
    """Missing directory, no runs, or an absent baseline; the message names what exists."""


Series = tuple[np.ndarray, np.ndarray]  # (iterations, values)


@dataclass
class Run:
    name: str
    scalars: dict[str, Series]
    record: dict = field(default_factory=dict)  # run.json, when the sweep wrote one
    notes: list[str] = field(default_factory=list)  # damaged inputs read around (shown in the table)

    def series(self, tag: str) -> Series:
        return self.scalars.get(tag, (np.zeros(0, dtype=np.int64), np.zeros(0)))

    @property
    def diverged(self) -> bool:
        return (self.record.get("status") == "diverged" or DIVERGED in self.scalars
                or first_not_finite(self.series(LOSS)) is not None)

    @property
    def seed_of(self) -> Optional[str]:
        match = SEED_RUN.match(self.name)
        return match["recipe"] if match else None


# ---- reading --------------------------------------------------------------------------------
def read_scalars(event_dir: Path) -> dict[str, Series]:
    """Every scalar tag of the event files in ``event_dir`` (all points: no reservoir sampling).

    A resumed run's second event file purges the first one's points from the resume step on."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(event_dir), size_guidance={SCALARS: 0}).Reload()
    out = {}
    for tag in events.Tags()[SCALARS]:
        points = events.Scalars(tag)
        out[tag] = (np.array([p.step for p in points], dtype=np.int64), np.array([p.value for p in points]))
    return out


def event_file_damage(path: Path) -> Optional[tuple[int, str]]:
    """(whole records before the damage, what is wrong) for a damaged event file; None when whole.

    Checks the TFRecord framing (each record's length, its CRC and that the record fits in the
    file), not the payloads: cheap, and what tells random bytes and a cut file apart."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    size, offset, records = path.stat().st_size, 0, 0
    with open(path, "rb") as handle:
        while offset < size:
            header = handle.read(12)
            if len(header) == 12 and masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
                return records, f"not a TensorBoard event record at byte {offset}"
            end = offset + 12 + (struct.unpack("<Q", header[:8])[0] if len(header) == 12 else 0) + 4
            if len(header) < 12 or end > size:
                return records, f"truncated at byte {size}"
            offset = handle.seek(end)
            records += 1
    return None


def _read_run(run_dir: Path, event_files: Sequence[Path]) -> tuple[Optional[Run], list[str]]:
    """The run in ``run_dir`` (None when none of its event files is readable) and its problems."""
    notes, readable = [], []
    for path in event_files:
        damage = event_file_damage(path)
        if damage is not None:
            notes.append(f"{path.relative_to(run_dir)}: {damage[1]}"
                         + (", skipped" if damage[0] == 0 else f", read its first {damage[0]} records"))
        if damage is None or damage[0]:
            readable.append(path)
    if not readable:
        return None, notes
    scalars: dict[str, Series] = {}
    for event_dir in sorted({path.parent for path in readable}):
        scalars.update(read_scalars(event_dir))
    record: dict = {}
    record_path = run_dir / "run.json"
    if record_path.is_file():
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except (OSError, ValueError, RecursionError) as error:
            notes.append(f"run.json unreadable ({type(error).__name__}), ignored")
            record = {}
    return Run(run_dir.name, scalars, record, notes), notes


def load_runs(output_dir: Path, skipped: Optional[list[tuple[str, str]]] = None) -> list[Run]:
    """The runs under ``output_dir``, sorted by name; runs whose event files are all damaged
    are left out and added to ``skipped`` as (run, reason)."""
    if not output_dir.is_dir():
        raise RunsReportError(f"runs directory {str(output_dir)!r} does not exist")
    runs = []
    for run_dir in sorted(p for p in output_dir.iterdir() if p.is_dir()):
        event_files = sorted(run_dir.rglob(EVENTS_GLOB))
        if not event_files:
            continue
        run, notes = _read_run(run_dir, event_files)
        if run is not None:
            runs.append(run)
        elif skipped is not None:
            skipped.append((run_dir.name, "; ".join(notes)))
    if not runs:
        found = ", ".join(sorted(p.name for p in output_dir.iterdir() if p.is_dir())) or "nothing"
        raise RunsReportError(f"no runs in {str(output_dir)!r}: no subdirectory holds TensorBoard event files "
                              f"({EVENTS_GLOB}); subdirectories: {found}")
    return runs


# ---- numbers --------------------------------------------------------------------------------
def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: exponential moving average with the startup bias removed."""
    out = np.empty(len(values))
    average, norm = 0.0, 0.0
    for i, value in enumerate(values):
        average = average * weight + (1 - weight) * value
        norm = norm * weight + (1 - weight)
        out[i] = average / norm if norm else value
    return out


def relative_gap(run: Series, baseline: Series, smoothing: float = 0.0) -> Series:
    """``run / baseline - 1`` at the iterations both logged, of the (smoothed) curves."""
    common, i, j = np.intersect1d(run[0], baseline[0], return_indices=True)
    return common, smooth(run[1], smoothing)[i] / smooth(baseline[1], smoothing)[j] - 1.0


def first_above(gap: Series, threshold: float) -> Optional[int]:
    above = np.flatnonzero(gap[1] > threshold)
    return int(gap[0][above[0]]) if above.size else None


def last_share_mean(values: np.ndarray, share: float = LAST_SHARE) -> float:
    if not values.size:
        return math.nan
    return float(values[-max(1, math.ceil(share * values.size)):].mean())


def grad_norm_spikes(values: np.ndarray, factor: float = SPIKE_FACTOR, window: int = SPIKE_WINDOW) -> int:
    """Iterations whose grad norm exceeds ``factor`` x the median of the previous ``window`` (>= 5 of them)."""
    return sum(1 for i in range(5, len(values))
               if values[i] > factor * np.median(values[max(0, i - window):i]))


def first_not_finite(series: Series) -> Optional[int]:
    """The first iteration whose value is NaN or infinite; None when all are finite."""
    bad = np.flatnonzero(~np.isfinite(series[1]))
    return int(series[0][bad[0]]) if bad.size else None


def loss_notes(run: Run, baseline: Run) -> list[str]:
    """Why gaps are blank from some iteration on: the run's or the baseline's loss is not finite."""
    notes = []
    for who, source in (("loss", run), (f"baseline {baseline.name}'s loss", baseline)):
        step = first_not_finite(source.series(LOSS))
        if step is not None and (source is run or run is not baseline):
            notes.append(f"{who} not finite from iteration {step}: gaps blank from there")
    return notes


def _median(series: Series) -> float:
    return float(np.median(series[1])) if series[1].size else math.nan


def summarize(run: Run, baseline: Run, smoothing: float) -> dict:
    """The table/CSV row of ``run`` against ``baseline``."""
    loss = run.series(LOSS)
    raw_gap = relative_gap(loss, baseline.series(LOSS))
    gap = relative_gap(loss, baseline.series(LOSS), smoothing)
    validation = run.series(VALIDATION)
    row = {
        "run": run.name, "recipe": run.record.get("recipe", run.seed_of or run.name),
        "status": run.record.get("status", "diverged" if run.diverged else "unknown"),
        "diverged": run.diverged,
        "iterations": int(loss[0][-1]) if loss[0].size else 0,
        "final loss": float(loss[1][-1]) if loss[1].size else math.nan,
        "gap at end": float(gap[1][-1]) if gap[1].size else math.nan,
        "gap last 10%": last_share_mean(raw_gap[1]),
    }
    for threshold in GAP_THRESHOLDS:
        row[f"first iteration gap > {threshold:.0%}"] = first_above(gap, threshold)
    row["grad-norm spikes"] = grad_norm_spikes(run.series(GRAD_NORM)[1])
    row["tokens/s"] = _median(run.series(TOKENS_PER_S))
    row["tokens/s vs baseline"] = row["tokens/s"] / _median(baseline.series(TOKENS_PER_S))
    row["final validation loss"] = float(validation[1][-1]) if validation[1].size else math.nan
    row["notes"] = "; ".join(run.notes + loss_notes(run, baseline))
    return row


def noise_band(baseline: Run, seeds: Sequence[Run], smoothing: float) -> Optional[tuple[np.ndarray, ...]]:
    """(iterations, low, high): the spread of the baseline's seed runs' gaps to it (0 included);
    None without seed runs."""
    gaps = [relative_gap(seed.series(LOSS), baseline.series(LOSS), smoothing) for seed in seeds]
    if not gaps:
        return None
    common = gaps[0][0]
    for steps, _ in gaps[1:]:
        common = np.intersect1d(common, steps)
    stacked = np.stack([values[np.isin(steps, common)] for steps, values in gaps] + [np.zeros(common.size)])
    return common, stacked.min(0), stacked.max(0)


def recipe_groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Recipe -> its runs (``NAME`` and ``NAME-seed<N>``), in the order of ``runs``."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.seed_of or run.name, []).append(run)
    return groups


def last_iteration(runs: Sequence[Run]) -> int:
    """The last training iteration any of ``runs`` logged (-1 for none)."""
    return max((int(run.series(LOSS)[0][-1]) for run in runs if run.series(LOSS)[0].size), default=-1)


def _seed_runs(runs: Sequence[Run], end: int) -> list[seed_stats.SeedRun]:
    """Runs that did not log iteration ``end`` (still running, interrupted) are incomplete."""
    return [seed_stats.SeedRun(run.series(LOSS), run.series(VALIDATION), run.diverged,
                               bool(run.series(LOSS)[0].size) and run.series(LOSS)[0][-1] >= end) for run in runs]


def recipe_table(groups: dict[str, list[Run]], baseline: str) -> list[dict]:
    """One ``seed_stats.recipe_row`` per recipe, the baseline first; a run is complete when it got
    as far as the furthest run of the study."""
    end = last_iteration([run for runs in groups.values() for run in runs])
    return [seed_stats.recipe_row(name, _seed_runs(runs, end), _seed_runs(groups[baseline], end))
            for name, runs in sorted(groups.items(), key=lambda item: item[0] != baseline)]


def band_payload(groups: dict[str, list[Run]], baseline: str, smoothing: float) -> dict:
    """Per recipe: (iterations, mean, min, max) of its seeds' smoothed losses, and of their gaps to
    the baseline's mean curve (complete runs only: a band stops where its shortest curve does)."""
    end = last_iteration([run for runs in groups.values() for run in runs])

    def curves(runs: Sequence[Run]) -> list[Series]:
        return [(run.series(LOSS)[0], smooth(run.series(LOSS)[1], smoothing)) for run, seed_run
                in zip(runs, _seed_runs(runs, end)) if seed_run.usable]

    base = seed_stats.band(curves(groups[baseline]))
    loss, gaps = {}, {}
    for name, runs in groups.items():
        own = curves(runs)
        mine = seed_stats.band(own)
        if mine is None or base is None:
            continue
        loss[name] = [values.tolist() for values in mine] + [len(own)]
        relative = [relative_gap(curve, (base[0], base[1])) for curve in own]
        gaps[name] = [values.tolist() for values in seed_stats.band(relative)]
    return {"loss": loss, "gap": gaps, "baseline": baseline, "smoothing": smoothing}


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


def _recipe_number(key: str, value):
    """A recipe-table cell: the gap signed in %, its ± and the noise in %, other floats to 4 digits."""
    if key == "gap to baseline":
        return f"{100 * value:+.2f} %"
    if key in ("gap ±", "baseline seed spread"):
        return f"{100 * value:.2f} %"
    return f"{value:.4f}" if isinstance(value, float) else value


def recipes_html(rows: list[dict]) -> str:
    """The recipe table and what its columns mean."""
    return "\n".join([
        "<h2 id='recipes'>Recipes over seeds</h2>",
        table(list(rows[0]), [_display(row, _recipe_number) for row in rows]),
        f"<p>Per seed run, loss = mean of its last {seed_stats.LAST_SHARE:.0%} of training losses; validation "
        "loss = its last one. Mean and sample std over a recipe's seeds (diverged runs, and incomplete ones "
        "that stopped before the study's last iteration, counted, not averaged). "
        "Gap = mean / baseline mean − 1; ± = one std combined from both recipes' seed spreads. Beyond noise: "
        "|gap| exceeds the baseline's seed spread ((max − min) / mean of its seeds). All numbers in "
        f"<a href='{link(RECIPES_CSV)}'>{RECIPES_CSV}</a>.</p>"])


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


# ---- report ---------------------------------------------------------------------------------
@dataclass
class RunsReport:
    index: Path
    csv: Path
    rows: list[dict]
    failed: list[tuple[str, str]]  # (figure, error)
    recipes: list[dict] = field(default_factory=list)  # one row per recipe over its seeds (with seed runs)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run, why): no readable event file


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({key: "" if value is None else value for key, value in row.items()} for row in rows)


def _run_number(key: str, value):
    """A run-table cell: gaps signed in %, ratios to the baseline in %."""
    if key.startswith("gap"):
        return f"{100 * value:+.2f} %"
    return f"{100 * value:.1f} %" if key.endswith("vs baseline") else value


def _display(row: dict, number=_run_number) -> list:
    """Table cells: missing values as a dash, yes/no, numbers as ``number(key, value)`` writes them."""
    cells = []
    for key, value in row.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            cells.append("–")
        elif isinstance(value, bool):
            cells.append("yes" if value else "no")
        else:
            cells.append(number(key, value))
    return cells


def _details(runs: Sequence[Run]) -> list[list]:
    rows = []
    for run in runs:
        rec = run.record
        rows.append([run.name, rec.get("status", "no run.json"), rec.get("recipe", ""), rec.get("git_commit") or "",
                     (rec.get("machine") or {}).get("host", ""), rec.get("start_time", ""), rec.get("end_time", ""),
                     len(rec.get("attempts", []))])
    return rows


def render_html(runs_dir: Path, baseline: Run, rows: list[dict], runs: Sequence[Run], jobs: Sequence[FigureJob],
                report_dir: Path, command: str, band, recipes: Sequence[dict] = (),
                skipped: Sequence[tuple[str, str]] = ()) -> str:
    stats = [job for job in jobs if job.path.startswith("stats_")]
    drawn = [job for job in jobs if (report_dir / job.path).is_file()]
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<title>Training run comparison</title>", f"<style>{STYLE}</style></head><body>",
             "<h1>Training run comparison</h1>",
             f"<p>{len(runs)} runs in <code>{html.escape(str(runs_dir))}</code> against the baseline "
             f"<b>{html.escape(baseline.name)}</b>, generated "
             f"{datetime.datetime.now().isoformat(timespec='seconds')} by <code>{html.escape(command)}</code>.</p>",
             "<nav><a href='#summary'>Summary</a><a href='#curves'>Curves</a><a href='#stats'>Quantization "
             "statistics</a><a href='#runs'>Runs</a></nav>",
             "<h2 id='summary'>Summary</h2>",
             table(list(rows[0]), [_display(row) for row in rows]),
             f"<p>Gap: loss / baseline loss − 1. Gap at end and first iteration above a threshold: smoothed "
             f"curves; last 10 %: raw. Grad-norm spikes: iterations above {SPIKE_FACTOR:g}× the median of the "
             f"previous {SPIKE_WINDOW}. Tokens/s: median. All numbers in <a href='{link(CSV_NAME)}'>"
             f"{CSV_NAME}</a>.</p>"]
    if recipes:
        parts.append(recipes_html(list(recipes)))
    if skipped:
        parts.append("<p class='note'>Skipped (no readable event file): " + "; ".join(
            f"<b>{html.escape(name)}</b>: {html.escape(reason)}" for name, reason in skipped) + "</p>")
    if band is not None:
        parts.append(f"<p class='note'>Baseline noise at the end (spread of its seed runs): "
                     f"{100 * band[1][-1]:+.2f} % to {100 * band[2][-1]:+.2f} %.</p>")
    parts.append("<h2 id='curves'>Curves</h2>")
    parts += [figure_html(job.path, job.caption) for job in drawn if job not in stats]
    parts.append("<h2 id='stats'>Quantization statistics</h2>")
    if stats:
        parts += [figure_html(job.path, job.caption) for job in drawn if job in stats]
    else:
        parts.append("<p>None of the runs logged stats-mode capture summaries (<code>train/quant/...</code>): "
                     "train with <code>TENSOR_SAVE_ENABLED=true TENSOR_SAVE_MODE=stats</code> to get them.</p>")
    parts += ["<h2 id='runs'>Runs</h2>",
              table(["run", "status", "recipe", "git commit", "host", "start", "end", "attempts"], _details(runs)),
              "</body></html>"]
    return "\n".join(parts) + "\n"


def write_runs_report(runs_dir: Path, report_dir: Path, baseline_name: str = "bf16", smoothing: float = 0.6,
                      dpi: int = 100, command: str = "") -> RunsReport:
    """Read the runs, draw the figures, write index.html and runs.csv into ``report_dir``."""
    if not 0 <= smoothing < 1:
        raise RunsReportError(f"smoothing must be in [0, 1), got {smoothing}")
    skipped: list[tuple[str, str]] = []
    runs = load_runs(runs_dir, skipped)
    by_name = {run.name: run for run in runs}
    if baseline_name not in by_name:
        raise RunsReportError(f"baseline {baseline_name!r} is not among the runs in {str(runs_dir)!r}: "
                              f"{', '.join(by_name)}; pick one with --baseline")
    baseline = by_name[baseline_name]
    if not baseline.series(LOSS)[0].size:
        raise RunsReportError(f"baseline {baseline_name!r} logged no {LOSS!r}; tags: {', '.join(baseline.scalars)}")
    ordered = [baseline] + [run for run in runs if run is not baseline]
    seeds = [run for run in ordered if run.seed_of in by_name]  # drawn as bands, not lines
    curves = [run for run in ordered if run not in seeds]
    band = noise_band(baseline, [run for run in seeds if run.seed_of == baseline_name], smoothing)
    rows = [summarize(run, baseline, smoothing) for run in ordered]
    groups = recipe_groups(ordered)
    recipes = recipe_table(groups, baseline_name) if len(groups) < len(ordered) else []
    report_dir.mkdir(parents=True, exist_ok=True)
    jobs = figure_jobs(curves, baseline, smoothing, band)
    if recipes:
        jobs.insert(1, FigureJob("loss_bands.png", "Each recipe's training loss over its seeds (mean and min-max "
                                                   "band) and its gap to the baseline's mean", _draw_bands,
                                 band_payload(groups, baseline_name, smoothing)))
        _write_csv(report_dir / RECIPES_CSV, recipes)
    failed = [(job.path, error) for job in jobs if (error := figures.render(job, report_dir, dpi)) is not None]
    _write_csv(report_dir / CSV_NAME, rows)
    index = report_dir / "index.html"
    index.write_text(render_html(runs_dir, baseline, rows, ordered, jobs, report_dir, command, band, recipes,
                                 skipped), encoding="utf-8")
    return RunsReport(index, report_dir / CSV_NAME, rows, failed, recipes, skipped)


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Compare training runs (one subdirectory of RUNS_DIR each, e.g. a recipe sweep): "
                               "loss curves and gaps to a baseline, throughput, quantization statistics.")
    parser.add_argument("runs_dir", type=Path, help="directory with one subdirectory per run")
    parser.add_argument("--output_dir", type=Path, default=None,
                        help="where index.html, runs.csv and the PNGs go (default: RUNS_DIR/report)")
    parser.add_argument("--baseline", default="bf16", help="run the gaps are relative to (default: %(default)s)")
    parser.add_argument("--smoothing", type=float, default=0.6,
                        help="TensorBoard-style smoothing weight in [0, 1) (default: %(default)s)")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the PNG files (default: %(default)s)")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Exit status: 0 done, 1 a figure failed (named on stderr), 2 bad input (message on stderr)."""
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.dpi < 1:
        parser.error(f"--dpi must be at least 1, got {args.dpi}")
    report_dir = args.output_dir or args.runs_dir / "report"
    try:
        check_output_dir(report_dir)
        result = write_runs_report(args.runs_dir, report_dir, args.baseline, args.smoothing, args.dpi,
                                   shlex.join([parser.prog, *argv]))
    except (RunsReportError, OutputDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(result.rows)} runs compared; report: {result.index}, table: {result.csv}")
    for name, reason in result.skipped:
        print(f"skipped run {name}: {reason}")
    for row in result.rows:
        if row["notes"]:
            print(f"note: {row['run']}: {row['notes']}")
    for path, error in result.failed:
        print(f"error: figure {path} could not be drawn: {error}", file=sys.stderr)
    return 1 if result.failed else 0
