"""``compare_formats``: re-quantize captured tensors with several formats; CSV, plots and a
summary into ``<output_dir>/format_comparison/``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

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
    parser.add_argument("--layer_types", nargs="+", help="only these layer types (linear, attention)")
    parser.add_argument("--roles", nargs="+", help="only these roles (qkv, proj, fc1, fc2, core_attention, ...)")
    parser.add_argument("--operations", nargs="+", help="only forward or backward captures")
    parser.add_argument("--tensor_names", nargs="+", help="only these tensor names (input, weight, grad_output, ...)")
    parser.add_argument("--layers", nargs="+", type=int, help="only these layer indices")
    parser.add_argument("--quant_types", nargs="+", help="only captures from runs with these quant types")
    parser.add_argument("--no_plots", action="store_true", help="tables and summary only")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> list[Path]:
    """Everything the command does; returns the files written."""
    from megatron.quant.formats import get_format

    fmts = [get_format(name) for name in args.formats]
    root = Path(args.tensor_dir)
    refs = whatif.select(whatif.find_captures(root, log),
                         **{name: getattr(args, name) for name in whatif.FILTER_KEYS})
    if not refs:
        raise ValueError(f"no high-precision captures under {args.tensor_dir!r} match the filters")
    log(f"{len(refs)} captures, formats {', '.join(f.name for f in fmts)}")
    rows = whatif.evaluate_all(refs, fmts, root, log)
    if not rows:
        raise ValueError(f"none of the {len(refs)} captures under {args.tensor_dir!r} could be read")
    best = whatif.best_formats(rows)
    folder = Path(args.output_dir) / whatif_report.FOLDER
    written = whatif_report.write_tables(rows, best, folder)
    images = [] if args.no_plots else [whatif_report.plot_by_class(rows, folder),
                                       *whatif_report.plot_by_layer(rows, folder)]
    written += images + whatif_report.write_summary(best, images, len(rows) // len(fmts), folder)
    for row in (b for b in best if b["among_bits"] == "all"):
        log(f"best for {row['tensor_class']}: {row['format']} ({row['mean_sqnr_db']:.2f} dB)")
    log(f"wrote {len(written)} files to {folder}")
    return written
