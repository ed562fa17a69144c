"""Speed of every format's fake quantization, eager and under torch.compile, against x.clone().

    python bench/bench_formats.py            # 16M elements (4096 x 4096), fp32 and bf16
    python bench/bench_formats.py --quick    # 1M elements, for a smoke run

Each time is the median of ``--repeats`` runs after a warm-up (which includes compilation);
the ratio is against ``x.clone()`` of the same tensor timed in the same run, so it carries
over between machines better than the absolute numbers. Blocks run along the last axis.
Goals (issue 2): compiled elementwise <= 2x clone, block <= 3x; eager <= 4x and 6x.
Writes bench/results/bench_formats.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from megatron.quant.formats import get_format, list_formats

GOALS = {("eager", False): 4.0, ("eager", True): 6.0, ("compiled", False): 2.0, ("compiled", True): 3.0}
RESULTS = Path(__file__).resolve().parent / "results" / "bench_formats.json"


def median_seconds(fn: Callable[[], torch.Tensor], repeats: int) -> float:
    fn()  # warm-up: compilation, allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_dtype(dtype: torch.dtype, names: list[str], numel: int, repeats: int, compile_too: bool) -> list[dict]:
    side = int(numel**0.5)
    x = torch.randn(side, numel // side, generator=torch.Generator().manual_seed(0)).to(dtype)
    clone = median_seconds(x.clone, repeats)
    print(f"\n{str(dtype):<15} clone: {clone * 1e3:8.2f} ms  ({x.numel() / clone / 1e9:.2f} G elements/s)", flush=True)
    rows = []
    for name in names:
        fmt = get_format(name)
        modes = {"eager": fmt.quantize}
        if compile_too:
            # Every format shares NumericFormat.quantize's code object: without a reset,
            # dynamo's recompile limit (8) would silently fall back to eager.
            torch._dynamo.reset()
            modes["compiled"] = torch.compile(fmt.quantize, dynamic=False)
        for mode, fn in modes.items():
            seconds = median_seconds(lambda: fn(x), repeats)
            ratio = seconds / clone
            goal = GOALS[(mode, fmt.block_size is not None)]
            rows.append({"format": name, "dtype": str(dtype).removeprefix("torch."), "mode": mode,
                         "ms": seconds * 1e3, "elements_per_s": x.numel() / seconds,
                         "ratio_to_clone": ratio, "goal": goal, "meets_goal": ratio <= goal})
            print(f"  {name:<12} {mode:<9} {seconds * 1e3:9.2f} ms  {x.numel() / seconds / 1e9:6.3f} G el/s  {ratio:6.2f}x clone"
                  f"  (goal {goal:.0f}x{'' if ratio <= goal else ', missed'})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M elements instead of 16M")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per case (median; >= 5)")
    parser.add_argument("--formats", nargs="*", default=None, help="subset of formats (default: all)")
    parser.add_argument("--eager-only", action="store_true", help="skip torch.compile")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    torch.set_num_threads(args.threads)
    numel = (1 << 20) if args.quick else (1 << 24)
    names = args.formats or list_formats()
    started = time.time()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        rows += bench_dtype(dtype, names, numel, args.repeats, not args.eager_only)
    report = {
        "benchmark": "bench_formats",
        "numel": numel,
        "repeats": args.repeats,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "load_average": os.getloadavg()},
        "seconds": time.time() - started,
        "results": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    missed = [f"{r['format']}/{r['dtype']}/{r['mode']}" for r in rows if not r["meets_goal"]]
    print(f"\nwrote {args.output}; goals missed: {', '.join(missed) or 'none'}")


if __name__ == "__main__":
    main()
