"""Command line shared by the visualization scripts and ``python -m megatron.quant.analysis``."""
from __future__ import annotations

import argparse
import functools
import re
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

from megatron.quant import notices

# Before megatron-core is imported (the capture catalog reads through the saver, which imports it): the
# report's and compare_formats' consoles show none of its known start-up notices, any other warning.
notices.hide_known()

from megatron.quant.analysis.captures.catalog import CatalogError  # noqa: E402
from megatron.quant.analysis.captures.families import BY_KEY, SETS, resolve  # noqa: E402
from megatron.quant.analysis.captures.loading import SummaryOptions  # noqa: E402
from megatron.quant.analysis.captures.pipeline import ReportOptions, run_report  # noqa: E402
from megatron.quant.analysis.captures.selection import CaptureFilter, FilterError  # noqa: E402
from megatron.quant.analysis.parallel import default_workers  # noqa: E402
from megatron.quant.analysis.plans import PlotSettings  # noqa: E402
from megatron.quant.output_dir import OutputDirError, check_output_dir  # noqa: E402
from megatron.quant.settings.selectors import IndexSet  # noqa: E402

_FILTERS = {  # option -> (parser of one token, help)
    "quant_types": (str, "quant types (directory / name token), e.g. hifp8 mxfp8"),
    "layers": ("int", "layer indices, e.g. 0 1 or 0-3"),
    "roles": (str, "module roles: qkv proj fc1 fc2 core_attention ..."),
    "tensor_names": (str, "tensor names: input weight output grad_output query ..."),
    "iterations": ("int", "training iterations, e.g. 0 or 10-20"),
    "ranks": ("int", "global ranks, e.g. 0 1"),
}


_INT_OR_RANGE = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")


def _int_tokens(text: str) -> IndexSet:
    """"3", "0-3" or "-1,4-5" -> their integers, ranges kept as ranges (``0-1000000000`` is not listed)."""
    spans = []
    for part in filter(None, text.split(",")):
        match = _INT_OR_RANGE.match(part)
        if match is None:
            raise argparse.ArgumentTypeError(f"{part!r} is not an integer or a range like 0-3")
        first, last = match.groups()
        spans.append((int(first), int(last if last is not None else first)))
    return IndexSet.of(spans)


def _str_tokens(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    """The capture filters (--quant_types, --layers, ...); ``capture_filter(args)`` reads them."""
    filters = parser.add_argument_group("filters (several values: any of them; values may also "
                                        "be comma-separated)")
    for name, (kind, text) in _FILTERS.items():
        filters.add_argument(f"--{name}", nargs="+", action="extend", help=text,
                             type=_int_tokens if kind == "int" else _str_tokens)


def build_parser(description: str, default_analyses: Sequence[str],
                 prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Analysis sets: " + "; ".join(f"{name} = {' '.join(keys)}"
                                            for name, keys in SETS.items()))
    parser.add_argument("--tensor_dir", default="./tensor_logs",
                        help="directory of captures, searched recursively (default: ./tensor_logs)")
    parser.add_argument("--output_dir", default="./draw", help="where figures and index.html go (default: ./draw)")
    parser.add_argument("--analyses", nargs="+", type=_str_tokens, action="extend",
                        help=f"analyses or sets to run (default: {' '.join(default_analyses)}); "
                             f"analyses: {', '.join(BY_KEY)}")
    add_filter_arguments(parser)
    tuning = parser.add_argument_group("performance and figures")
    tuning.add_argument("--workers", type=int, default=default_workers(),
                        help="worker processes reading captures and drawing figures (default: %(default)s)")
    tuning.add_argument("--sample_size", type=int, default=SummaryOptions.sample_size,
                        help="values sampled per tensor (default: %(default)s)")
    tuning.add_argument("--figure_budget", type=int, default=PlotSettings.figure_budget,
                        help="sampled values drawn per figure (default: %(default)s)")
    tuning.add_argument("--max_panels", type=int, default=PlotSettings.max_panels,
                        help="subplots per figure (default: %(default)s)")
    tuning.add_argument("--min_trend_iterations", type=int,
                        default=PlotSettings.min_trend_iterations,
                        help="iterations needed to draw curves over training (default: %(default)s)")
    tuning.add_argument("--dpi", type=int, default=100, help="resolution of the PNG files (default: %(default)s)")
    tuning.add_argument("--no_progress", action="store_true", help="no progress bars on stderr")
    parser.set_defaults(analyses=None, _default_analyses=list(default_analyses))
    return parser


def capture_filter(args: argparse.Namespace) -> CaptureFilter:
    def chosen(name: str) -> Optional[frozenset | IndexSet]:
        lists = vars(args)[name]
        if lists is None:
            return None
        if _FILTERS[name][0] == "int":
            return functools.reduce(IndexSet.union, lists, IndexSet())
        return frozenset(v for values in lists for v in values)
    return CaptureFilter(**{name: chosen(name) for name in _FILTERS})


def _positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if vars(args)[name] < 1:
            parser.error(f"--{name} must be at least 1, got {vars(args)[name]}")


def main(argv: Optional[Sequence[str]] = None, default_analyses: Sequence[str] = ("all",),
         description: str = "Draw figures and an HTML report from captured tensors.",
         prog: Optional[str] = None) -> int:
    """Exit status: 0 done (a figure that breaks the figure budget is a warning on stderr and in
    the report), 1 some figure could not be drawn (named on stderr and in the report), 2 bad
    input (message on stderr). ``runs ...`` compares training runs instead (``runs.report``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["runs"]:
        from megatron.quant.analysis.runs import report as runs_report

        return runs_report.main(argv[1:], prog=f"{prog or Path(sys.argv[0]).name} runs")
    parser = build_parser(description, default_analyses, prog)
    args = parser.parse_args(argv)
    _positive(parser, args, "workers", "sample_size", "figure_budget", "max_panels",
              "min_trend_iterations", "dpi")
    names = ([n for values in args.analyses for n in values] if args.analyses
             else args._default_analyses)
    try:
        analyses = resolve(names)
    except ValueError as error:
        parser.error(str(error))
    options = ReportOptions(
        tensor_dir=Path(args.tensor_dir), output_dir=Path(args.output_dir), analyses=analyses,
        capture_filter=capture_filter(args),
        summary=SummaryOptions(sample_size=args.sample_size),
        settings=PlotSettings(figure_budget=args.figure_budget, max_panels=args.max_panels,
                              min_trend_iterations=args.min_trend_iterations),
        workers=args.workers, dpi=args.dpi, progress=not args.no_progress,
        command=shlex.join([parser.prog, *argv]))
    try:
        check_output_dir(options.output_dir)
        result = run_report(options)
    except (CatalogError, FilterError, OutputDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{len(result.figures)} figures in {options.output_dir}; report: {result.index}")
    if result.skipped:
        print(f"{len(result.skipped)} file(s) skipped (listed in the report)")
    for path, warning in result.warnings:
        print(f"warning: figure {path} is drawn, but may hide something: {warning}", file=sys.stderr)
    for path, error in result.failed:
        print(f"error: figure {path} could not be drawn: {error}", file=sys.stderr)
    return 1 if result.failed else 0

