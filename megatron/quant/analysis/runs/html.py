"""The runs comparison's HTML page and CSV files."""
from __future__ import annotations

import csv
import datetime
import html
import math
from pathlib import Path
from typing import Mapping, Sequence

from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.report import STYLE, figure_html, link, table
from megatron.quant.analysis.runs import forest, seed_stats
from megatron.quant.analysis.runs.metrics import SPIKE_FACTOR, SPIKE_WINDOW
from megatron.quant.analysis.runs.read import Run

CSV_NAME = "runs.csv"
RECIPES_CSV = "recipes.csv"


def _recipe_number(key: str, value):
    """A recipe-table cell: the gap signed in %, its ± and the noise in %, other floats to 4 digits."""
    if key in ("gap to baseline", "paired gap"):
        return f"{100 * value:+.2f} %"
    if key in ("gap ±", "baseline seed spread", "paired gap std", "paired 95% ±"):
        return f"{100 * value:.2f} %"
    return f"{value:.4f}" if isinstance(value, float) else value


def recipes_html(rows: list[dict], study: str = "") -> str:
    """The recipe table, what its columns mean, and ``study``: the forest plot's figure HTML."""
    return "\n".join([
        "<h2 id='recipes'>Recipes over seeds</h2>", study,
        table(list(rows[0]), [_display(row, _recipe_number) for row in rows]),
        f"<p>Per seed run, loss = mean of its last {seed_stats.LAST_SHARE:.0%} of training losses; validation "
        "loss = its last one. Mean and sample std over a recipe's seeds (diverged runs, and incomplete ones "
        "(not finished in their run.json: still running, interrupted, crashed; without one, stopped before the "
        "study's last iteration) counted, not averaged; seeds that end at different iterations are not averaged, "
        "and a recipe that ends elsewhere than the baseline gets no gap: the notes say so). "
        "Gap = mean / baseline mean − 1; ± = one std combined from both recipes' seed spreads. Beyond noise: "
        "|gap| exceeds the baseline's seed spread ((max − min) / mean of its seeds). Paired: each run against "
        "its baseline twin of the same seed (same initialisation and data order), on the validation loss "
        f"averaged over the last {seed_stats.PAIRED_EVALUATIONS} evaluations; mean over the pairs, their std, "
        "and the 95 % Student-t interval of the mean (beyond noise, paired: the interval leaves 0). Mixed pairs: "
        "pairs whose two runs ran from different commits, from a tree with uncommitted changes, or with the recipe "
        "resolved otherwise than in its other seeds (the notes say which): such a pair may compare two codes, not "
        "two recipes. All numbers in "
        f"<a href='{link(RECIPES_CSV)}'>{RECIPES_CSV}</a>.</p>"])


def write_csv_rows(path: Path, rows: list[dict]) -> None:
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
                skipped: Sequence[tuple[str, str]] = (), warnings: Mapping[str, str] = {}) -> str:
    """``warnings``: figure path -> what breaks the figure budget (shown above the figure)."""
    stats = [job for job in jobs if job.path.startswith("stats_")]
    drawn = [job for job in jobs if (report_dir / job.path).is_file()]

    def shown(job: FigureJob) -> str:
        warning = warnings.get(job.path)
        note = (f"<p class='note'>Warning: {html.escape(job.path)} may hide something: "
                f"{html.escape(warning)}</p>" if warning else "")
        return note + figure_html(job.path, job.caption)
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
    study = next((job for job in drawn if job.path == forest.NAME), None)
    if recipes:
        parts.append(recipes_html(list(recipes), shown(study) if study else ""))
    if skipped:
        parts.append("<p class='note'>Skipped (no readable event file): " + "; ".join(
            f"<b>{html.escape(name)}</b>: {html.escape(reason)}" for name, reason in skipped) + "</p>")
    if band is not None:
        parts.append(f"<p class='note'>Baseline noise at the end (spread of its seed runs): "
                     f"{100 * band[1][-1]:+.2f} % to {100 * band[2][-1]:+.2f} %.</p>")
    parts.append("<h2 id='curves'>Curves</h2>")
    parts += [shown(job) for job in drawn if job not in stats and job is not study]
    parts.append("<h2 id='stats'>Quantization statistics</h2>")
    if stats:
        parts += [shown(job) for job in drawn if job in stats]
    else:
        parts.append("<p>None of the runs logged stats-mode capture summaries (<code>train/quant/...</code>): "
                     "train with <code>TENSOR_SAVE_ENABLED=true TENSOR_SAVE_MODE=stats</code> to get them.</p>")
    parts += ["<h2 id='runs'>Runs</h2>",
              table(["run", "status", "recipe", "git commit", "host", "start", "end", "attempts"], _details(runs)),
              "</body></html>"]
    return "\n".join(parts) + "\n"
