"""What-if outputs in ``<output_dir>/format_comparison/``: CSV tables, PNG plots, and a
``summary.md`` / ``summary.html`` fragment that the visualization report links to.

A preset is one ``format`` series like a format name; its rows carry the ``operand`` they
evaluate, and wgrad uses are tensor classes of their own (``whatif.tensor_class``)."""
from __future__ import annotations

import csv
import html
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from megatron.quant.analysis import figure_render, figures
from megatron.quant.analysis.captures.catalog import SkippedFile
from megatron.quant.analysis.plans import FigureJob
from megatron.quant.analysis.report import figure_html
from megatron.quant.compare import whatif_accumulation
from megatron.quant.compare.whatif import IDENTITY_FIELDS, tensor_class

FOLDER = "format_comparison"
SKIPPED_CSV = "skipped_files.csv"
NOT_QUANTIZED_CSV = "not_quantized.csv"
ACCUMULATION_CSV = "accumulation.csv"  # whatif_accumulation's rows: the Hopper accumulator's error per GEMM
DPI = 100
SKIPPED_SHOWN = 50  # in the summary; the CSV lists every skipped file
STAT_COLUMNS = ("format", "operand", "bits", "sqnr_db", "relative_error", "rel_mse", "cosine",
                "overflow", "overflow_ratio", "underflow", "underflow_ratio")
PANELS = (("sqnr_db", "SQNR (dB)"), ("relative_error", "relative error"),
          ("overflow_ratio", "overflow (% of elements)"), ("underflow_ratio", "underflow (% of elements)"))
PERCENT = frozenset({"overflow_ratio", "underflow_ratio"})  # shares drawn in %, as in every figure of the report


def clear_previous(folder: Path) -> None:
    """Remove what an earlier run wrote into ``folder`` so no stale table or plot survives."""
    for pattern in ("*.csv", "by_class.png", "by_layer*.png", "accumulation.png", "summary.md", "summary.html"):
        for path in folder.glob(pattern):
            path.unlink()


def write_tables(rows: Sequence[Mapping], best: Sequence[Mapping], skipped: Sequence[SkippedFile],
                 not_quantized: Sequence[Mapping], folder: Path, accumulation: Sequence[Mapping] = ()) -> list[Path]:
    """``format_comparison.csv`` (one row per tensor, format and, for presets, operand use),
    ``best_formats.csv``, ``skipped_files.csv`` (path, reason), ``not_quantized.csv`` (what
    presets leave unquantized: ``whatif.summarize_not_quantized``'s groups) and, with
    ``accumulation`` rows, ``accumulation.csv`` (``whatif_accumulation.COLUMNS``)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if accumulation:
        written.append(folder / ACCUMULATION_CSV)
        _write_csv(written[0], whatif_accumulation.COLUMNS, accumulation)
    per_tensor = folder / "format_comparison.csv"
    _write_csv(per_tensor, [*IDENTITY_FIELDS, "file", "axis", "tensor_class", *STAT_COLUMNS],
               [{**row, "tensor_class": tensor_class(row)} for row in rows])
    best_path = folder / "best_formats.csv"
    _write_csv(best_path, ["tensor_class", "among_bits", "format", "bits", "mean_sqnr_db", "tensors"], best)
    skipped_path = folder / SKIPPED_CSV
    _write_csv(skipped_path, ["path", "reason"], [{"path": s.path, "reason": s.reason} for s in skipped])
    not_quantized_path = folder / NOT_QUANTIZED_CSV
    _write_csv(not_quantized_path, ["format", "tensor_class", "operand", "layers", "tensors", "reason"], not_quantized)
    return [per_tensor, best_path, skipped_path, not_quantized_path, *written]


def describe_not_quantized(entry: Mapping) -> str:
    """One line for a ``summarize_not_quantized`` group."""
    operand = f" ({entry['operand']})" if entry["operand"] else ""
    return (f"{entry['format']} leaves {entry['tensor_class']}{operand} unquantized in layer(s) {entry['layers']} "
            f"({entry['tensors']} tensor(s)): {entry['reason']}")


def figure_jobs(rows: Sequence[Mapping]) -> list[FigureJob]:
    """``by_class.png``: per statistic, a heatmap of tensor class x format with the class means
    written in (a zero overflow reads as 0, not as a missing bar); ``by_layer.png``, when a class
    is seen in more than one layer: SQNR per class and layer, one heatmap per format."""
    classes = sorted({tensor_class(row) for row in rows})
    names = list(dict.fromkeys(row["format"] for row in rows))
    jobs = [FigureJob(f"{FOLDER}/by_class.png", "Mean of each statistic per tensor class (rows) and format "
                      "(columns); a panel whose values are all equal says so instead.", draw_by_class,
                      {"classes": classes, "formats": names, "panels": {
                          title: [[(100 if key in PERCENT else 1) * _mean(
                                       r[key] for r in rows if r["format"] == name and tensor_class(r) == cls)
                                   for name in names] for cls in classes] for key, title in PANELS}})]
    curves = {}
    for cls in classes:
        subset = [row for row in rows if tensor_class(row) == cls]
        layers = sorted({row["layer_idx"] for row in subset})
        if len(layers) > 1:
            curves[cls] = {name: (layers, [_mean(r["sqnr_db"] for r in subset if r["format"] == name
                                                 and r["layer_idx"] == layer) for layer in layers])
                           for name in dict.fromkeys(row["format"] for row in subset)}
    if curves:
        jobs.append(FigureJob(f"{FOLDER}/by_layer.png", f"SQNR along the layers, one panel per format: its "
                              f"{len(curves)} tensor classes (rows) seen in more than one layer (columns); every "
                              "statistic per layer is in format_comparison.csv.", draw_by_layer, curves))
    return jobs


def accumulation_job(rows: Sequence[Mapping]) -> list[FigureJob]:
    """``accumulation.png``: per candidate, a heatmap of module GEMM (rows) x layer of the mean SQNR of the
    Hopper accumulator's output against the exact product (``whatif_accumulation``); none without rows."""
    finite = [row for row in rows if row["sqnr_db"] is not None]
    if not finite:
        return []
    names = list(dict.fromkeys(row["format"] for row in finite))
    gemms = sorted({f"{row['role']} {row['gemm']} ({row['accumulate']})" for row in finite})
    layers = sorted({row["layer_idx"] for row in finite})
    cells = {name: [[_mean(r["sqnr_db"] for r in finite if r["format"] == name and r["layer_idx"] == layer
                           and f"{r['role']} {r['gemm']} ({r['accumulate']})" == gemm) for layer in layers]
                    for gemm in gemms] for name in names}
    return [FigureJob(f"{FOLDER}/accumulation.png", "SQNR (dB) of each GEMM's output under a Hopper FP8 tensor "
                      "core's accumulator against the exact product of the same quantized operands, per layer "
                      "(mean over the captured steps; relative error = 10^(-SQNR/20), every value in "
                      f"{ACCUMULATION_CSV}).", draw_accumulation,
                      {"gemms": gemms, "layers": layers, "cells": cells})]


def draw_accumulation(payload: dict):
    gemms, layers, cells = payload["gemms"], payload["layers"], payload["cells"]
    fig, axes = figures.subplot_grid(len(cells), ncols=2, panel_size=(5.8, 1.6 + 0.22 * len(gemms)))
    for ax, (name, values) in zip(axes, cells.items()):
        figures.label_heatmap(ax, gemms, layers, np.array(values, dtype=float), f"{name}: accumulator SQNR (dB)",
                              "SQNR (dB)", fmt="{:.1f}")
        ax.set_xlabel("layer")
    return figures.finish(fig, "The GEMM outputs under a Hopper FP8 accumulator")


def draw_by_class(payload: dict):
    panels = payload["panels"]
    height = 1.4 + 0.22 * len(payload["classes"])
    fig, axes = figures.subplot_grid(len(panels), ncols=2, panel_size=(5.9, height))  # within the page's width
    for ax, (title, cells) in zip(axes, panels.items()):
        values = [v for row in cells for v in row]
        if not figures.one_value(ax, values, title):
            figures.label_heatmap(ax, payload["classes"], payload["formats"], np.array(cells, dtype=float),
                                  title, title, log=title != "SQNR (dB)" and figures.spans_decades(values))
        ax.set_title(title, fontsize=10)
    return figures.finish(fig, "What-if re-quantization: mean per tensor class")


def draw_by_layer(payload: dict):
    """One heatmap per format, tensor class x layer, the SQNR written in: a few layers make lines of a
    few flat points, and formats of equal SQNR lines hidden under each other."""
    classes = list(payload)
    names = list(dict.fromkeys(name for series in payload.values() for name in series))
    layers = sorted({layer for series in payload.values() for xs, _ in series.values() for layer in xs})
    fig, axes = figures.subplot_grid(len(names), ncols=2, panel_size=(5.8, 1.4 + 0.22 * len(classes)))
    for ax, name in zip(axes, names):
        cells = np.full((len(classes), len(layers)), np.nan)
        for row, cls in enumerate(classes):
            for layer, value in zip(*payload[cls].get(name, ((), ()))):
                cells[row, layers.index(layer)] = value
        figures.label_heatmap(ax, classes, layers, cells, f"{name}: SQNR (dB)", "SQNR (dB)", fmt="{:.1f}")
        ax.set_xlabel("layer")
    return figures.finish(fig, "SQNR along the layers per tensor class")


def draw(rows: Sequence[Mapping], output_dir: Path, log: Callable[[str], None],
         accumulation: Sequence[Mapping] = ()) -> list[FigureJob]:
    """Draw the figures into ``output_dir``/FOLDER; returns those drawn (a failure is logged)."""
    drawn = []
    for job in [*figure_jobs(rows), *accumulation_job(accumulation)]:
        outcome = figure_render.render(job, output_dir, DPI)
        if outcome.drawn:
            drawn.append(job)
        else:
            log(f"error: figure {job.path} could not be drawn: {outcome.error}")
        if outcome.warning():
            log(f"warning: figure {job.path} is drawn, but may hide something: {outcome.warning()}")
    return drawn


def accumulation_summary(rows: Sequence[Mapping]) -> list[dict]:
    """Per candidate, GEMM and accumulation: the GEMMs evaluated, their mean relative error and mean SQNR."""
    groups: dict[tuple[str, str, str], list[Mapping]] = {}
    for row in rows:
        groups.setdefault((row["format"], row["gemm"], row["accumulate"]), []).append(row)
    return [{"format": name, "gemm": gemm, "accumulate": mode, "gemms": len(group),
             "relative_error": _mean(r["relative_error"] for r in group), "sqnr_db": _mean(r["sqnr_db"] for r in group)}
            for (name, gemm, mode), group in groups.items()]


def write_summary(best: Sequence[Mapping], images: Sequence[FigureJob], tensors: int, skipped: Sequence[SkippedFile],
                  not_quantized: Sequence[Mapping], folder: Path, accumulation: Sequence[Mapping] = ()) -> list[Path]:
    """``summary.md`` and ``summary.html`` (a fragment): best format per tensor class, the Hopper
    accumulator's error per GEMM (``accumulation_summary``), the plots, what presets leave unquantized
    and the files skipped."""
    overall = [row for row in best if row["among_bits"] == "all"]
    by_width = [row for row in best if row["among_bits"] != "all"]
    md = [f"## Format comparison (what-if re-quantization of {tensors} captured tensors)", "",
          "Best format per tensor class: highest mean SQNR over the class's tensors. A preset is "
          "evaluated per GEMM operand with its format for that operand; `class@wgrad.*` is the "
          "captured tensor as the weight-gradient GEMM uses it (blocked along tokens).", "",
          "| tensor class | best overall | SQNR (dB) | best per bit width |", "|---|---|---|---|"]
    for row in overall:
        widths = ", ".join(f"{b['bits']}-bit: {b['format']}" for b in by_width
                           if b["tensor_class"] == row["tensor_class"])
        md.append(f"| {row['tensor_class']} | {row['format']} | {row['mean_sqnr_db']:.2f} | {widths} |")
    md += ["", "Tables: [format_comparison.csv](format_comparison.csv), [best_formats.csv](best_formats.csv)", ""]
    totals = accumulation_summary(accumulation)
    if totals:
        md += ["Hopper FP8 accumulation: each GEMM's output against the exact product of the same quantized "
               f"operands (all in [{ACCUMULATION_CSV}]({ACCUMULATION_CSV})).", "",
               "| format | GEMM | accumulation | GEMMs | mean relative error | mean SQNR (dB) |",
               "|---|---|---|---|---|---|"]
        md += [f"| {t['format']} | {t['gemm']} | {t['accumulate']} | {t['gemms']} | {t['relative_error']:.3g} | "
               f"{t['sqnr_db']:.1f} |" for t in totals]
        md.append("")
    md += [f"![{image.caption}]({Path(image.path).name})" for image in images]
    if not_quantized:
        md += ["", f"Not evaluated under a preset (all in [{NOT_QUANTIZED_CSV}]({NOT_QUANTIZED_CSV})):", ""]
        md += [f"- {describe_not_quantized(entry)}" for entry in not_quantized]
    if skipped:
        md += ["", f"Skipped files ({len(skipped)}, all in [{SKIPPED_CSV}]({SKIPPED_CSV})):", ""]
        md += [f"- `{s.path}`: {s.reason}" for s in skipped[:SKIPPED_SHOWN]]
    md_path = folder / "summary.md"
    md_path.write_text("\n".join(md) + "\n")

    cells = "".join(
        f"<tr><td>{html.escape(row['tensor_class'])}</td><td>{html.escape(row['format'])}</td>"
        f"<td>{row['mean_sqnr_db']:.2f}</td></tr>" for row in overall)
    drawn = "".join(figure_html(image.path, image.caption) if Path(image.path).name != "by_layer.png" else
                    f"<details><summary>SQNR along the layers per tensor class</summary>"
                    f"{figure_html(image.path, image.caption)}</details>" for image in images)
    fragment = (f'<section id="format-comparison"><h2>Format comparison</h2>'
                f"<p>What-if re-quantization of {tensors} captured tensors; best format per tensor class "
                f'by mean SQNR. Tables: <a href="{FOLDER}/format_comparison.csv">per tensor</a>, '
                f'<a href="{FOLDER}/best_formats.csv">best formats</a>.</p>'
                f"<table><tr><th>tensor class</th><th>best format</th><th>SQNR (dB)</th></tr>{cells}</table>"
                f"{_accumulation_html(totals)}{drawn}{_not_quantized_html(not_quantized)}{_skipped_html(skipped)}"
                "</section>\n")
    html_path = folder / "summary.html"
    html_path.write_text(fragment)
    return [md_path, html_path]


def _accumulation_html(totals: Sequence[Mapping]) -> str:
    if not totals:
        return ""
    cells = "".join(f"<tr><td>{html.escape(t['format'])}</td><td>{t['gemm']}</td><td>{t['accumulate']}</td>"
                    f"<td>{t['gemms']}</td><td>{t['relative_error']:.3g}</td><td>{t['sqnr_db']:.1f}</td></tr>"
                    for t in totals)
    return (f"<p>Hopper FP8 accumulation: each GEMM's output against the exact product of the same quantized "
            f'operands (<a href="{FOLDER}/{ACCUMULATION_CSV}">per GEMM and step</a>).</p><table><tr><th>format</th>'
            f"<th>GEMM</th><th>accumulation</th><th>GEMMs</th><th>mean relative error</th><th>mean SQNR (dB)</th>"
            f"</tr>{cells}</table>")


def _not_quantized_html(not_quantized: Sequence[Mapping]) -> str:
    if not not_quantized:
        return ""
    items = "".join(f"<li>{html.escape(describe_not_quantized(entry))}</li>" for entry in not_quantized)
    return (f'<h3>Not evaluated under a preset</h3><p>All in <a href="{FOLDER}/{NOT_QUANTIZED_CSV}">'
            f"{NOT_QUANTIZED_CSV}</a>.</p><ul>{items}</ul>")


def _skipped_html(skipped: Sequence[SkippedFile]) -> str:
    if not skipped:
        return ""
    items = "".join(f"<li><code>{html.escape(s.path)}</code>: {html.escape(s.reason)}</li>"
                    for s in skipped[:SKIPPED_SHOWN])
    return (f'<h3>Skipped files ({len(skipped)})</h3><p>All in <a href="{FOLDER}/{SKIPPED_CSV}">'
            f"{SKIPPED_CSV}</a>.</p><ul>{items}</ul>")


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[Mapping]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _mean(values: Iterable[float | None]) -> float:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else float("nan")
