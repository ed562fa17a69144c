"""From a tensor directory to figures and index.html: list, filter, summarise, draw, report."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from megatron.quant.analysis import figure_render
from megatron.quant.analysis.captures.catalog import CatalogError, SkippedFile, build_catalog
from megatron.quant.analysis.captures.families import ANALYSES
from megatron.quant.analysis.captures.inputs import Analysis, AnalysisInput
from megatron.quant.analysis.captures.loading import SummaryOptions, summarize_all
from megatron.quant.analysis.captures.selection import CaptureFilter, select
from megatron.quant.analysis.captures.summary import TensorSummary, group_by, pooled_moments
from megatron.quant.analysis.parallel import parallel_map
from megatron.quant.analysis.plans import AnalysisPlan, FigureJob, PlotSettings
from megatron.quant.analysis.report import NOTES_FILE, RunSummary, Section, write_report


@dataclass(frozen=True)
class ReportOptions:
    tensor_dir: Path
    output_dir: Path
    analyses: tuple[Analysis, ...]
    capture_filter: CaptureFilter = CaptureFilter()
    summary: SummaryOptions = SummaryOptions()
    settings: PlotSettings = PlotSettings()
    workers: int = 1
    dpi: int = 100
    progress: bool = True
    command: str = ""


@dataclass(frozen=True)
class ReportResult:
    index: Path
    figures: tuple[str, ...]                  # drawn, relative to the output directory
    failed: tuple[tuple[str, str], ...]       # (figure, error) that could not be drawn
    skipped: tuple[SkippedFile, ...]
    notes: tuple[str, ...]
    warnings: tuple[tuple[str, str], ...] = ()  # (figure, what breaks the figure budget): drawn anyway


def run_report(options: ReportOptions) -> ReportResult:
    """Raises CatalogError (nothing to analyse) or FilterError (a filter matches nothing)."""
    inp = analysis_input(options)
    plans = [(analysis, _build(analysis, inp)) for analysis in options.analyses]
    jobs = [job for _, plan in plans for job in plan.figures]
    outcomes = dict(zip((job.path for job in jobs), parallel_map(
        _render, [(job, options.output_dir, options.dpi) for job in jobs], options.workers,
        "drawing figures", options.progress, chunksize=1)))
    sections = [_section(analysis, plan, outcomes, options.output_dir) for analysis, plan in plans]
    index = write_report(options.output_dir, _run_summary(options, inp), sections,
                         order=[a.key for a in ANALYSES])
    return ReportResult(
        index=index,
        figures=tuple(path for path, drawn in outcomes.items() if drawn.drawn),
        failed=tuple((path, drawn.error) for path, drawn in outcomes.items() if not drawn.drawn),
        warnings=tuple((path, warning) for path, drawn in outcomes.items() if (warning := drawn.warning())),
        skipped=inp.skipped,
        notes=tuple(note for section in sections for note in section.notes))


def analysis_input(options: ReportOptions) -> AnalysisInput:
    """The selected, readable captures summarised: what every analysis plans its figures from."""
    catalog = build_catalog(options.tensor_dir)
    options.capture_filter.validate(catalog.records)
    selected = select(catalog.records, options.capture_filter, unknown_role_passes=True)
    if not selected:
        raise CatalogError(f"no capture under {options.tensor_dir} matches all the filters "
                           f"({options.capture_filter.describe()})")
    summaries, unreadable = summarize_all(selected, summary_options(options), options.workers,
                                          catalog.root, options.progress)
    summaries = [s for s in summaries if options.capture_filter.matches(s.record)]
    skipped = tuple(catalog.skipped) + tuple(unreadable)
    if not summaries:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:3])
        raise CatalogError(f"no readable capture under {options.tensor_dir} matches the filters"
                           + (f" ({len(skipped)} skipped, e.g. {reasons})" if skipped else ""))
    options.output_dir.mkdir(parents=True, exist_ok=True)
    return AnalysisInput(tuple(summaries), options.output_dir, options.tensor_dir,
                         options.capture_filter.describe(), skipped, options.settings)


def summary_options(options: ReportOptions) -> SummaryOptions:
    """Skip the per-capture work no selected analysis needs (heatmaps, format views)."""
    needs = set().union(*(analysis.needs for analysis in options.analyses))
    base = options.summary
    return replace(base, heatmap_size=base.heatmap_size if "heatmap" in needs else 0,
                   format_elements=base.format_elements if "format" in needs else 0)


def _build(analysis: Analysis, inp: AnalysisInput) -> AnalysisPlan:
    if analysis.folder:
        (inp.output_dir / analysis.folder).mkdir(parents=True, exist_ok=True)
    return analysis.build(inp)


def _render(item: tuple[FigureJob, Path, int]) -> figure_render.Drawn:
    job, output_dir, dpi = item
    return figure_render.render(job, output_dir, dpi)


def _section(analysis: Analysis, plan: AnalysisPlan, outcomes: dict[str, figure_render.Drawn],
             output_dir: Path) -> Section:
    notes = list(plan.notes) + [f"Figure {job.path} could not be drawn: {outcomes[job.path].error}"
                                for job in plan.figures if not outcomes[job.path].drawn]
    notes += [f"Warning: figure {job.path} is drawn, but may hide something ({warning})"
              for job in plan.figures if (warning := outcomes[job.path].warning())]
    notes_file = output_dir / analysis.folder / NOTES_FILE
    if analysis.folder and notes:
        notes_file.write_text("\n".join(notes) + "\n", encoding="utf-8")
    elif notes_file.exists():
        notes_file.unlink()  # a note of an earlier run that no longer holds
    return Section(
        key=analysis.key, title=analysis.title, folder=analysis.folder,
        description=analysis.description,
        figures=[{"path": job.path, "caption": job.caption} for job in plan.figures
                 if outcomes[job.path].drawn],
        files=[{"path": f.path, "caption": f.caption} for f in plan.files]
        + ([{"path": f"{analysis.folder}/{NOTES_FILE}", "caption": "what was not drawn and why"}]
           if analysis.folder and notes else []),
        notes=notes)


def _run_summary(options: ReportOptions, inp: AnalysisInput) -> RunSummary:
    originals = inp.originals
    moments = pooled_moments(originals)
    return RunSummary(
        tensor_dir=str(options.tensor_dir.resolve()),
        generated_at=datetime.now().isoformat(timespec="seconds"),
        command=options.command or " ".join(sys.argv),
        filters=inp.filters,
        options=(f"sample_size={options.summary.sample_size}, "
                 f"figure_budget={options.settings.figure_budget}, workers={options.workers}"),
        totals={"captures analysed": len(originals),
                "tensor files": sum(s.record.path is not None for s in originals),
                "statistics-only manifest entries": sum(s.record.path is None for s in originals),
                "quantized copies": len(inp.summaries) - len(originals),
                "values (all elements)": int(moments["numel"]),
                "value range": f"[{moments['min']:.5g}, {moments['max']:.5g}]",
                "mean / std": f"{moments['mean']:.5g} / {moments['std']:.5g}",
                "skipped files": len(inp.skipped)},
        per_quant_type=[_quant_type_row(qt, items) for qt, items in
                        group_by(originals, lambda s: s.record.quant_type).items()],
        skipped=[{"path": s.path, "reason": s.reason} for s in inp.skipped])


def _quant_type_row(quant_type: str, items: list[TensorSummary]) -> dict:
    moments = pooled_moments(items)
    return {"quant type": quant_type, "captures": len(items),
            "layer types": ", ".join(sorted({s.record.layer_type for s in items})),
            "operations": ", ".join(sorted({s.record.operation for s in items})),
            "layers": len({s.record.layer_idx for s in items}),
            "iterations": len({s.record.iteration for s in items}),
            "ranks": len({s.record.rank for s in items}),
            "values": int(moments["numel"]), "min": moments["min"], "max": moments["max"],
            "mean": moments["mean"], "std": moments["std"]}
