"""``python -m bench.gpu.kernels_worker ROWS.jsonl [--dry-run]``: bench_formats' rows, one JSON line each
as it is measured. Path-major (every format's Triton rows, then eager torch, then torch.compile, whose
cold compiles cost most), so a run stopped at its deadline has the kernels' rows first."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bench.bench_formats import VARIANTS, bench_dtype
from megatron.quant.formats import list_formats

DTYPES = (torch.float32, torch.bfloat16)


def plan(dry_run: bool) -> dict:
    """What is measured: bench_formats' arguments, and per path whether the dual-axis and statistics rows
    are taken (torch.compile's are not: each is a cold compile of its own, and their goals are the
    kernels'). The dry run: two formats, eager, toy size, on the CPU."""
    if dry_run:
        return {"device": "cpu", "names": ["hifp8", "mxfp8_e4m3"], "modes": {"eager": True}, "numel": 1 << 12,
                "repeats": 5}
    return {"device": "cuda", "names": list_formats() + list(VARIANTS),
            "modes": {"triton": True, "eager": True, "compiled": False}, "numel": 1 << 24, "repeats": 7}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    chosen = plan(args.dry_run)
    with open(args.rows, "a") as out:
        for mode, all_cases in chosen["modes"].items():
            for dtype in DTYPES:
                for row in bench_dtype(dtype, chosen["names"], chosen["numel"], chosen["repeats"], [mode],
                                       chosen["device"], dual_axis=all_cases, stats=all_cases):
                    out.write(json.dumps(row) + "\n")
                    out.flush()


if __name__ == "__main__":
    main()
