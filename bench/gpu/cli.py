"""The command line of ``bench/gpu_check.py``."""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Sequence

from megatron.quant.output_dir import OutputDirError, check_output_dir

from .registry import DEFAULT_BUDGET_S, DEFAULT_STAGES, STAGES
from .runner import SUMMARY_NAME, run_stages
from .stage import REPO

USAGE = """Does this recipe train? The GPU check: env, correct, kernels, train (and capture) in one command.

    python bench/gpu_check.py --out ./gpu_check           # on your GPU node (docs/gpu.md)
    python bench/gpu_check.py --dry-run --out /tmp/check  # every stage on the CPU, toy sizes, in seconds
"""


def slug(device: str) -> str:
    """A device name as a file-name part: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def device_name(dry_run: bool) -> str | None:
    """The CUDA device's name; 'cpu (dry run)'; None when there is no CUDA device to check."""
    if dry_run:
        return "cpu (dry run)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", action="append", choices=tuple(STAGES), default=None,
                        help=f"a stage to run, repeatable, in the order given (default: {','.join(DEFAULT_STAGES)})")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for <stage>.json, summary.md and the log "
                             "(default bench/results/gpu_check_<device>)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"wall budget of the whole check in seconds (default {DEFAULT_BUDGET_S}): a stage whose "
                             "estimate exceeds what is left is skipped, running commands are killed at its end")
    parser.add_argument("--dry-run", action="store_true", help="every stage on the CPU at toy sizes")
    parser.add_argument("--study-plan", type=Path, default=None,
                        help="the study stage's plan (default docs/study/anchor-3m.yaml, the anchor tier a wave per "
                             "call; docs/study/first-tier.yaml: the first tier, sized on the device; "
                             "docs/study/plan.yaml: the anchor at 7.6M, for a GPU of one's own)")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        parser.error(f"--budget-s must be positive, not {args.budget_s:g}; allowed: a finite number of seconds above 0")

    args.device = device_name(args.dry_run)
    if args.device is None:
        parser.error("torch sees no CUDA device: run on a GPU machine, or --dry-run on a CPU")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(dict.fromkeys(args.stage or DEFAULT_STAGES))
    out = args.out or REPO / "bench" / "results" / f"gpu_check_{slug(args.device)}"
    try:  # before any stage: a file, a path under one, or a read-only folder would fail at its first write
        check_output_dir(out, "--out")
    except OutputDirError as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    records = run_stages(names, STAGES, out, args.budget_s, args.dry_run, args.device, study_plan=args.study_plan)
    print((out / SUMMARY_NAME).read_text())
    print(f"wrote {out}")
    return 1 if any(record["status"] == "error" for record in records.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
