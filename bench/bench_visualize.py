"""Benchmark: quick and full visualization report over many large captures.

Writes ``--files`` capture files of ``--numel`` elements (default 1000 x 1M, 4 GB) with
manifests into a temporary directory, then times, each in a fresh process:
  baseline  reading every file once with torch.load(weights_only=True), one process;
  quick     quick_analysis.png + tensor_stats.txt + index.html;
  full      every analysis (what one_click_visualize.sh runs).
Peak memory is the report process's own max RSS plus its largest worker's max RSS times the
number of workers (an upper bound of what runs at once; mapped file pages count in RSS).
Goals on a 2-core machine: quick < 10 s, full < 60 s, peak < 4 GB.

    python bench/bench_visualize.py                      # the full-size run
    python bench/bench_visualize.py --files 100 --numel 100000
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
import capture_fixture  # noqa: E402  (test data writer: files and manifests per docs/interfaces.md)

QUANT_TYPES = ("hifp8", "mxfp8", "mxfp4", "bf16")
GOALS = {"quick": 10.0, "full": 60.0}
PEAK_GOAL_GB = 4.0

# Run in a fresh interpreter: the report, then its own and its workers' peak RSS as JSON.
_RUNNER = """
import json, resource, sys, time
t = time.perf_counter()
if sys.argv[1] == "baseline":
    from pathlib import Path
    import torch
    for path in sorted(Path(sys.argv[2]).rglob("*.pt")):
        torch.load(path, map_location="cpu", weights_only=True)["tensor"].float().sum()
    code = 0
else:
    from megatron.quant.analysis.cli import main
    code = main(sys.argv[2:])
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "code": code,
                  "self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _shape(layer_type: str, name: str, numel: int) -> tuple[int, ...]:
    if layer_type == "attention":
        head_dim, heads = 64, 8
        return (max(1, numel // (head_dim * heads)), 1, heads, head_dim)
    width = 1024 if numel >= 1024 * 32 else 64
    if "weight" in name:
        return (max(1, numel // width), width)
    return (max(1, numel // width), 1, width)


def write_dataset(root: Path, files: int, numel: int) -> float:
    """``files`` captures spread over quant types, layers and tensors; returns seconds taken.

    A handful of distinct tensors (and their statistics) are reused: writing, not
    generating, is what the benchmark has to be fast at."""
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    cache: dict[tuple, tuple[torch.Tensor, dict]] = {}
    captures = []
    layer = 0
    while len(captures) < files:
        for quant_type in QUANT_TYPES:
            fmt = None if quant_type == "bf16" else quant_type
            for layer_type, tensors, role in capture_fixture.MODULES:
                for (operation, phase), names in tensors.items():
                    for name in names:
                        if len(captures) == files:
                            break
                        shape = _shape(layer_type, name, numel)
                        operand = fmt if name in capture_fixture.QUANTIZED_OPERANDS else None
                        key = (shape, name.startswith("grad"), operand is not None)
                        if key not in cache:
                            x = rng.standard_normal(shape).astype(np.float32)
                            x *= 1e-4 if name.startswith("grad") else 1.0
                            stats = capture_fixture.numpy_tensor_stats(x)
                            if operand:
                                stats.update(capture_fixture.e4m3_quant_stats(x))
                            cache[key] = (torch.from_numpy(x), stats)
                        tensor, stats = cache[key]
                        m = capture_fixture.metadata(
                            quant_type=quant_type, layer_type=layer_type, layer_idx=layer,
                            operation=operation, phase=phase, tensor_name=name, role=role,
                            fmt=operand, shape=shape, counter=len(captures))
                        captures.append(capture_fixture.Capture(m, tensor, stats))
        layer += 1
    capture_fixture.write_captures(root, captures)
    return time.perf_counter() - start


def run(kind: str, tensor_dir: Path, output_dir: Path, workers: int) -> dict:
    args = [] if kind == "baseline" else [
        "--tensor_dir", str(tensor_dir), "--output_dir", str(output_dir),
        "--workers", str(workers), "--no_progress",
        "--analyses", "quick" if kind == "quick" else "all"]
    done = subprocess.run([sys.executable, "-c", _RUNNER, kind,
                           *(args or [str(tensor_dir)])],
                          capture_output=True, text=True, cwd=REPO, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise RuntimeError(f"{kind} report failed ({result['code']}): {done.stderr[-2000:]}")
    # Linux reports ru_maxrss in KiB.
    result["peak_gb"] = (result["self_kb"] + (workers if kind != "baseline" else 0)
                         * result["children_kb"]) / 2 ** 20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--numel", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (median)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench_visualize_"))
    try:
        tensor_dir = workdir / "tensor_logs"
        write_seconds = write_dataset(tensor_dir, args.files, args.numel)
        print(f"wrote {args.files} files of {args.numel:,} elements in {write_seconds:.1f} s",
              file=sys.stderr)
        results = {}
        for kind in ("baseline", "quick", "full"):
            runs = [run(kind, tensor_dir, workdir / f"draw_{kind}", args.workers)
                    for _ in range(args.repeats)]
            results[kind] = {"seconds_median": statistics.median(r["seconds"] for r in runs),
                             "seconds": [round(r["seconds"], 2) for r in runs],
                             "peak_gb": max(r["peak_gb"] for r in runs)}
        base = results["baseline"]["seconds_median"]
        print(f"{'run':<10}{'median s':>10}{'x baseline':>12}{'goal s':>8}{'peak GB':>9}")
        for kind, r in results.items():
            goal = GOALS.get(kind)
            print(f"{kind:<10}{r['seconds_median']:>10.2f}{r['seconds_median'] / base:>12.2f}"
                  f"{goal if goal else '':>8}{r['peak_gb']:>9.2f}")
        report = {"files": args.files, "numel": args.numel, "workers": args.workers,
                  "repeats": args.repeats, "write_seconds": write_seconds,
                  "goals_seconds": GOALS, "peak_goal_gb": PEAK_GOAL_GB, "results": results,
                  "meets_goals": all(results[k]["seconds_median"] < g for k, g in GOALS.items())
                  and all(r["peak_gb"] < PEAK_GOAL_GB for r in results.values())}
        out = REPO / "bench" / "results" / "bench_visualize.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(f"JSON: {out}")
    finally:
        if args.keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
