"""Compare training runs (e.g. a recipe sweep) from their TensorBoard event files.

``python -m megatron.quant.analysis runs OUTPUT_DIR [--output_dir REPORT_DIR] [--baseline bf16]``:
every subdirectory of OUTPUT_DIR holding event files (at any depth, e.g. ``NAME/tensorboard/``)
is one run named after the subdirectory; runs ``<recipe>-seed<N>`` are extra seeds of
``<recipe>``: the baseline's give the noise band, and every recipe with seeds gets a mean curve
with a min-max band and a row of the recipe table (``seed_stats``). Writes ``index.html``
(self-contained, links the PNGs beside it), ``runs.csv`` (one row per run) and, with seed runs,
``recipes.csv`` (one row per recipe). ``--ledger DIR`` adds (or, without OUTPUT_DIR, gives) the runs
of a study ledger (``ledger``: one JSON per finished run, one study on one corpus). ``--label
RECIPE=NAME`` shows a recipe's runs under another name: a recipe whose definition changed since its
runs, under the name of what they ran (``te-nvfp4=te-nvfp4-sr24``).

Gaps are relative: ``loss_run / loss_baseline - 1`` at the iterations both logged. The gap at
the end and the first iteration above 1 % / 5 % use the smoothed losses (TensorBoard's debiased
exponential moving average, ``--smoothing``); the average over the last 10 % uses the raw ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

from megatron.quant.analysis import figure_render
from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.runs.draw import draw_bands, figure_jobs
from megatron.quant.analysis.runs.forest import forest_job, read_anchors
from megatron.quant.analysis.runs.html import CSV_NAME, RECIPES_CSV, render_html, write_csv_rows
from megatron.quant.analysis.runs.ledger import ledger_runs
from megatron.quant.analysis.runs.metrics import band_payload, noise_band, recipe_groups, recipe_table, summarize
from megatron.quant.analysis.runs.read import LOSS, Run, RunsReportError, load_runs
from megatron.quant.output_dir import OutputDirError, check_output_dir


@dataclass
class RunsReport:
    index: Path
    csv: Path
    rows: list[dict]
    failed: list[tuple[str, str]]  # (figure, error): not drawn
    recipes: list[dict] = field(default_factory=list)  # one row per recipe over its seeds (with seed runs)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run, why): no readable event file
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (figure, what breaks the figure budget)


def _all_runs(runs_dir: Optional[Path], ledger_dir: Optional[Path], corpus: Optional[str],
              skipped: list[tuple[str, str]]) -> list[Run]:
    """The run directories' runs, then the ledger's; a name in both is refused."""
    runs = load_runs(runs_dir, skipped) if runs_dir is not None else []
    from_ledger = ledger_runs(ledger_dir, corpus, skipped) if ledger_dir is not None else []
    twice = sorted({run.name for run in runs} & {run.name for run in from_ledger})
    if twice:
        raise RunsReportError(f"run(s) {', '.join(twice)} are both in {str(runs_dir)!r} and in the ledger "
                              f"{str(ledger_dir)!r}; give one of them")
    return runs + from_ledger


def parse_labels(values: Sequence[str]) -> dict[str, str]:
    """``RECIPE=NAME`` values as {recipe: name}; RunsReportError names a malformed one."""
    labels = {}
    for value in values:
        recipe, sep, name = value.partition("=")
        if not sep or not recipe or not name or "=" in name or name.strip() != name:
            raise RunsReportError(f"--label {value[:80]!r}: expected RECIPE=NAME, e.g. te-nvfp4=te-nvfp4-sr24")
        labels[recipe] = name
    return labels


def relabel(runs: Sequence[Run], labels: Mapping[str, str]) -> list[Run]:
    """``runs`` with each labelled recipe's runs renamed (``NAME``, ``NAME-seed<N>``); RunsReportError
    for a label whose recipe has no run."""
    recipes = {run.seed_of or run.name for run in runs}
    unknown = sorted(set(labels) - recipes)
    if unknown:
        raise RunsReportError(f"--label: no runs of {', '.join(unknown)}; the recipes are {', '.join(sorted(recipes))}")
    out = []
    for run in runs:
        recipe = run.seed_of or run.name
        if recipe in labels:
            name = labels[recipe] + run.name[len(recipe):]
            run = dataclasses.replace(run, name=name, record={**run.record, "recipe": labels[recipe]},
                                      notes=[*run.notes, f"ran as recipe {recipe}, shown as {labels[recipe]}"])
        out.append(run)
    return out


def write_runs_report(runs_dir: Optional[Path], report_dir: Path, baseline_name: str = "bf16", smoothing: float = 0.6,
                      dpi: int = 100, command: str = "", ledger_dir: Optional[Path] = None,
                      corpus: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                      anchors: Sequence[dict] = ()) -> RunsReport:
    """Read the runs (of ``runs_dir``, of the ledger ``ledger_dir`` on the corpus ``corpus``, or both;
    ``labels``: recipes shown under another name), draw the figures, write index.html and runs.csv
    into ``report_dir``."""
    if not 0 <= smoothing < 1:
        raise RunsReportError(f"smoothing must be in [0, 1), got {smoothing}")
    skipped: list[tuple[str, str]] = []
    runs = relabel(_all_runs(runs_dir, ledger_dir, corpus, skipped), labels or {})
    source = runs_dir if runs_dir is not None else ledger_dir
    by_name = {run.name: run for run in runs}
    if baseline_name not in by_name:
        raise RunsReportError(f"baseline {baseline_name!r} is not among the runs in {str(source)!r}: "
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
    jobs = all_figure_jobs(curves, baseline, smoothing, band, groups, recipes, anchors)
    if recipes:
        write_csv_rows(report_dir / RECIPES_CSV, recipes)
    outcomes = {job.path: figure_render.render(job, report_dir, dpi) for job in jobs}
    failed = [(path, drawn.error) for path, drawn in outcomes.items() if not drawn.drawn]
    warnings = [(path, warning) for path, drawn in outcomes.items() if (warning := drawn.warning())]
    write_csv_rows(report_dir / CSV_NAME, rows)
    index = report_dir / "index.html"
    index.write_text(render_html(source, baseline, rows, ordered, jobs, report_dir, command, band, recipes,
                                 skipped, dict(warnings)), encoding="utf-8")
    return RunsReport(index, report_dir / CSV_NAME, rows, failed, recipes, skipped, warnings)


def all_figure_jobs(curves: Sequence[Run], baseline: Run, smoothing: float, band, groups: dict[str, list[Run]],
                    recipes: Sequence[dict], anchors: Sequence[dict] = ()) -> list[FigureJob]:
    """Every figure of the report; with a recipe table, the study's forest plot and the seed bands."""
    jobs = figure_jobs(curves, baseline, smoothing, band)
    if recipes:
        bands = band_payload(groups, baseline.name, smoothing)
        jobs[1:1] = [forest_job(recipes, baseline.name, bands["loss"], anchors=anchors),
                     FigureJob("loss_bands.png", "Each recipe's training loss over its seeds (mean and min-max "
                                                 "band) and its gap to the baseline's mean", draw_bands, bands)]
    return jobs


def _anchors(path: Optional[Path]) -> list[dict]:
    """``forest.read_anchors`` of ``path`` (none without one); RunsReportError for an unreadable table."""
    try:
        return read_anchors(path) if path is not None else []
    except (OSError, ValueError) as error:
        raise RunsReportError(f"--anchors: {error}") from error


def build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Compare training runs (one subdirectory of RUNS_DIR each, e.g. a recipe sweep): "
                               "loss curves and gaps to a baseline, throughput, quantization statistics.")
    parser.add_argument("runs_dir", type=Path, nargs="?", default=None,
                        help="directory with one subdirectory per run (optional with --ledger)")
    parser.add_argument("--ledger", type=Path, default=None, metavar="DIR",
                        help="also the runs of this study ledger (docs/study/ledger/<study>: one JSON per run)")
    parser.add_argument("--corpus", default=None, metavar="HASH_PREFIX",
                        help="the ledger's runs on this corpus only (its sha256 or a prefix)")
    parser.add_argument("--output_dir", type=Path, default=None,
                        help="where index.html, runs.csv and the PNGs go (default: RUNS_DIR/report)")
    parser.add_argument("--baseline", default="bf16", help="run the gaps are relative to (default: %(default)s)")
    parser.add_argument("--label", action="append", default=[], metavar="RECIPE=NAME",
                        help="show RECIPE's runs as NAME (e.g. a recipe whose definition changed since they ran: "
                             "te-nvfp4=te-nvfp4-sr24); repeatable")
    parser.add_argument("--anchors", type=Path, default=None, metavar="CSV",
                        help="published gaps drawn beside ours in the forest plot (docs/study/quartet2_anchors.csv)")
    parser.add_argument("--smoothing", type=float, default=0.6,
                        help="TensorBoard-style smoothing weight in [0, 1) (default: %(default)s)")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the PNG files (default: %(default)s)")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Exit status: 0 done (a figure that breaks the figure budget is a warning on stderr and on the
    page), 1 a figure could not be drawn (named on stderr), 2 bad input (message on stderr)."""
    parser = build_parser(prog)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.dpi < 1:
        parser.error(f"--dpi must be at least 1, got {args.dpi}")
    if args.runs_dir is None and args.ledger is None:
        parser.error("give RUNS_DIR, --ledger DIR, or both")
    if args.runs_dir is None and args.output_dir is None:
        parser.error("with --ledger alone, give --output_dir (where the report goes)")
    report_dir = args.output_dir or args.runs_dir / "report"
    try:
        check_output_dir(report_dir)
        result = write_runs_report(args.runs_dir, report_dir, args.baseline, args.smoothing, args.dpi,
                                   shlex.join([parser.prog, *argv]), args.ledger, args.corpus,
                                   parse_labels(args.label), _anchors(args.anchors))
    except (RunsReportError, OutputDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(result.rows)} runs compared; report: {result.index}, table: {result.csv}")
    for name, reason in result.skipped:
        print(f"skipped run {name}: {reason}")
    for row in result.rows:
        if row["notes"]:
            print(f"note: {row['run']}: {row['notes']}")
    for path, warning in result.warnings:
        print(f"warning: figure {path} is drawn, but may hide something: {warning}", file=sys.stderr)
    for path, error in result.failed:
        print(f"error: figure {path} could not be drawn: {error}", file=sys.stderr)
    return 1 if result.failed else 0
