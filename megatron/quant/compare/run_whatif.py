"""``compare_formats``: re-quantize captured tensors with several formats; CSV, plots and a
summary into ``<output_dir>/format_comparison/``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from megatron.quant.analysis import cli, report
from megatron.quant.analysis.captures.catalog import CatalogError
from megatron.quant.compare import whatif, whatif_accumulation, whatif_report
from megatron.quant.output_dir import OutputDirError, check_output_dir
from megatron.quant.recipes import presets

DEFAULT_FORMATS = ("hifp8", "mxfp8", "mxfp4", "nvfp4")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Which format would hurt each captured tensor least? Re-quantizes captured "
                    "high-precision tensors along their GEMM's block axis and compares formats.")
    parser.add_argument("--tensor_dir", required=True, help="capture directory (TENSOR_SAVE_DIR), searched recursively")
    parser.add_argument("--output_dir", default="./draw",
                        help=f"results go into OUTPUT_DIR/{whatif_report.FOLDER}/ (default ./draw)")
    parser.add_argument("--formats", nargs="+", default=list(DEFAULT_FORMATS),
                        help=f"format names and recipe presets ({', '.join(presets.preset_names())}): a preset "
                             f"quantizes each GEMM operand a capture feeds with its own format "
                             f"(default {' '.join(DEFAULT_FORMATS)})")
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
    candidates = whatif.parse_candidates(args.formats)
    folder = Path(args.output_dir) / whatif_report.FOLDER
    check_output_dir(folder, "--output_dir")
    capture_filter = cli.capture_filter(args)
    root = Path(args.tensor_dir)
    records, unlisted, num_layers = whatif.find_captures(root, capture_filter, args.include_outputs)
    log(f"{len(records)} captures, formats {', '.join(c.name for c in candidates)}")
    if any(c.recipe is not None for c in candidates):
        log(f"presets resolved for {num_layers} layers (the largest captured layer index + 1)")
    rows, not_quantized, unusable = whatif.evaluate_all(records, candidates, root, capture_filter, num_layers, log)
    accumulation, unloaded = whatif_accumulation.evaluate_all(records, candidates, root, num_layers, log)
    listed = {entry.path for entry in unusable}
    skipped = unlisted + unusable + [entry for entry in unloaded if entry.path not in listed]
    for entry in skipped:
        log(f"skipping {entry.path}: {entry.reason}")
    unquantized = whatif.summarize_not_quantized(not_quantized)
    for entry in unquantized:
        log(f"not evaluated: {whatif_report.describe_not_quantized(entry)}")
    if not rows:
        left = "".join(f"; {whatif_report.describe_not_quantized(entry)}" for entry in unquantized)
        raise ValueError(f"no usable high-precision capture under {args.tensor_dir!r} matches "
                         f"the filters ({capture_filter.describe()}) and is quantized by --formats{left}")
    best = whatif.best_formats(rows)
    whatif_report.clear_previous(folder)
    written = whatif_report.write_tables(rows, best, skipped, unquantized, folder, accumulation)
    images = [] if args.no_plots else whatif_report.draw(rows, Path(args.output_dir), log, accumulation)
    tensors = len({row["file"] for row in rows})
    written += [Path(args.output_dir) / image.path for image in images]
    written += whatif_report.write_summary(best, images, tensors, skipped, unquantized, folder, accumulation)
    for row in (b for b in best if b["among_bits"] == "all"):
        log(f"best for {row['tensor_class']}: {row['format']} ({row['mean_sqnr_db']:.2f} dB)")
    log(f"wrote {len(written)} files to {folder}")
    if skipped:
        log(f"{len(skipped)} file(s) skipped (listed in {folder / whatif_report.SKIPPED_CSV})")
    index = report.refresh_index(Path(args.output_dir))
    if index is not None:
        log(f"added the comparison to {index}")
    return written
