"""Cost of the Hopper FP8 accumulation model (``formats.accumulation``: fast and promoted) against the
exact FP32 GEMM of the same FP8-valued operands, on the CPU.

The model's block step runs compiled (torch.compile) from ``COMPILE_FROM`` products, eager below; the
first row's first call pays the one compilation (``compile_s``, also its time in inductor's cache for a
later process). ``--eager`` times the eager step on every shape, for comparison.

    python bench/bench_accumulate.py           # the layers' shapes of llama-tiny and the study's model
    python bench/bench_accumulate.py --quick   # two small shapes, for a smoke run
    python bench/bench_accumulate.py --eager   # the eager block step, never compiled

Each time is the median CPU time of the process over ``--repeats`` runs after a warm-up (on a shared
machine wall time also counts the other jobs; with one thread the CPU time is the run's own); the ratio
is against the exact GEMM (``a @ b.T`` in float32) timed in the same run. Writes
bench/results/bench_accumulate.json (``--eager``: bench_accumulate_eager.json).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from megatron.quant.formats.accumulation import Operands, hopper_accumulate

RESULTS = Path(__file__).resolve().parent / "results"
# (M tokens, N outputs, K reduction): llama-tiny's fprop of qkv and fc2 at 256 tokens, and a K of 4096
SHAPES = ((256, 512, 256), (256, 256, 768), (64, 64, 4096))
QUICK = ((32, 32, 256), (16, 16, 1024))


def operands(m: int, n: int, k: int) -> Operands:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn).float()
    b = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn).float()
    return Operands(a, b)


def cpu_seconds(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    """Median CPU seconds of this process running ``fn``, after a warm-up call (compilation, allocator)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def run(shapes: Sequence[tuple[int, int, int]], repeats: int, eager: bool) -> list[dict]:
    rows, compiled = [], False if eager else None
    for m, n, k in shapes:
        ops = operands(m, n, k)
        exact = cpu_seconds(lambda: ops.a @ ops.b.t(), repeats)
        row = {"m": m, "n": n, "k": k, "exact_s": exact}
        if not rows:  # the first call compiles the block step (where the shape is large enough)
            start = time.perf_counter()
            hopper_accumulate(ops, fast=True, compiled=compiled)
            row["compile_s"] = time.perf_counter() - start
        for mode in ("fast", "promoted"):
            seconds = cpu_seconds(lambda: hopper_accumulate(ops, mode == "fast", compiled=compiled), repeats)
            row[f"{mode}_s"], row[f"{mode}_ratio"] = seconds, seconds / exact
        rows.append(row)
        print(f"M {m:>5} N {n:>5} K {k:>5}: exact {exact * 1e3:8.2f} ms, fast {row['fast_ratio']:7.1f}x, "
              f"promoted {row['promoted_ratio']:7.1f}x", flush=True)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small shapes")
    parser.add_argument("--eager", action="store_true", help="never compile the model's block step")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="CPU threads (default: torch's, %(default)s)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be positive, got {args.repeats} and {args.threads}")
    torch.set_num_threads(args.threads)
    rows = run(QUICK if args.quick else SHAPES, args.repeats, args.eager)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_accumulate{'_eager' if args.eager else ''}.json"
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "threads": args.threads,
                               "torch": torch.__version__,
                               "eager": args.eager, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
