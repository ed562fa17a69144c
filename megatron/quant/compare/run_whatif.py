"""``compare_formats``: re-quantize captured tensors with several formats; CSV, plots and a
summary into ``<output_dir>/format_comparison/``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from megatron.quant.analysis import cli, report
from megatron.quant.analysis.catalog import CatalogError
from megatron.quant.analysis.output_dir import OutputDirError, check_output_dir
from megatron.quant.compare import whatif, whatif_report

DEFAULT_FORMATS = ("hifp8", "mxfp8", "mxfp4", "nvfp4")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Which format would hurt each captured tensor least? Re-quantizes captured "
                    "high-precision tensors along their GEMM's block axis and compares formats.")
    parser.add_argument("--tensor_dir", required=True, help="capture directory (TENSOR_SAVE_DIR), searched recursively")
    parser.add_argument("--output_dir", default="./draw",
                        help=f"results go into OUTPUT_DIR/{whatif_report.FOLDER}/ (default ./draw)")
    parser.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS),
                        help=f"format names (default {' '.join(DEFAULT_FORMATS)})")
    cli.add_filter_arguments(parser)
    parser.add_argument("--include_outputs", action="store_true",
                        help="also re-quantize GEMM results (phase post: outputs, gradients), along their "
                             "recorded axis; by default only GEMM operands (phase pre)")
    parser.add_argument("--no_plots", action="store_true", help="tables and summary only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, FileNotFoundError, CatalogError, OutputDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> list[Path]:
    """Everything the command does; returns the files written."""
    from megatron.quant.formats import get_format

    fmts = [get_format(name) for name in args.formats]
    folder = Path(args.output_dir) / whatif_report.FOLDER
    check_output_dir(folder, "--output_dir")
    capture_filter = cli.capture_filter(args)
    root = Path(args.tensor_dir)
    records, unlisted = whatif.find_captures(root, capture_filter, args.include_outputs)
    log(f"{len(records)} captures, formats {', '.join(f.name for f in fmts)}")
    rows, unusable = whatif.evaluate_all(records, fmts, root, capture_filter, log)
    skipped = unlisted + unusable
    for entry in skipped:
        log(f"skipping {entry.path}: {entry.reason}")
    if not rows:
        raise ValueError(f"no usable high-precision capture under {args.tensor_dir!r} matches "
                         f"the filters ({capture_filter.describe()})")
    best = whatif.best_formats(rows)
    whatif_report.clear_previous(folder)
    written = whatif_report.write_tables(rows, best, skipped, folder)
    images = [] if args.no_plots else [whatif_report.plot_by_class(rows, folder),
                                       *whatif_report.plot_by_layer(rows, folder)]
    written += images + whatif_report.write_summary(best, images, len(rows) // len(fmts), skipped, folder)
    for row in (b for b in best if b["among_bits"] == "all"):
        log(f"best for {row['tensor_class']}: {row['format']} ({row['mean_sqnr_db']:.2f} dB)")
    log(f"wrote {len(written)} files to {folder}")
    if skipped:
        log(f"{len(skipped)} file(s) skipped (listed in {folder / whatif_report.SKIPPED_CSV})")
    index = report.refresh_index(Path(args.output_dir))
    if index is not None:
        log(f"added the comparison to {index}")
    return written
