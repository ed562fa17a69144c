"""Training step time of llama-tiny on CPU: each format and capture mode vs bf16 (no fake quantization).

Every variant is a real ``megatron-quant-train`` run (``main(argv)``: data, DDP, optimizer,
logging); the step time is the median of its iterations after warm-up. Variants run in
interleaved rounds so machine noise hits all alike; ratios are against the bf16 baseline
of the same run.

    python bench/bench_train.py [--iters 8] [--rounds 2] [--formats hifp8,mxfp8_e4m3]
Writes bench/results/bench_train.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

BASELINE = "bf16"


def variants(format_names: list[str]) -> dict[str, dict]:
    """name -> environment; capture variants capture every iteration after the first."""
    out = {BASELINE: {"CUSTOM_QUANT_TYPE": BASELINE}}
    out.update({name: {"CUSTOM_QUANT_TYPE": name} for name in format_names})
    for mode in ("stats", "full"):
        out[f"hifp8+capture_{mode}"] = {"CUSTOM_QUANT_TYPE": "hifp8", "TENSOR_SAVE_ENABLED": "true",
                                        "TENSOR_SAVE_MODE": mode, "TENSOR_SAVER_ITERATION": "1-1000"}
    return out


def step_times(env: dict, iters: int, micro_batch: int, save_dir: str) -> list[float]:
    from megatron.quant.train import main
    from megatron.quant.training.env import scoped_environ

    env = dict(env, TENSOR_SAVE_DIR=save_dir)
    try:
        with scoped_environ(env):
            history = main(["--model", "llama-tiny", "--mock-data", "--train-iters", str(iters), "--eval-iters", "0",
                            "--micro-batch-size", str(micro_batch), "--global-batch-size", str(2 * micro_batch),
                            "--log-interval", str(iters)])
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
    return [h["iteration time (s)"] for h in history[1:]]  # the first iteration warms up


def main() -> None:
    from megatron.quant import formats

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--formats", default=None, help="comma-separated; default: every non-passthrough format")
    args = p.parse_args()
    names = args.formats.split(",") if args.formats else [f for f in formats.list_formats() if not formats.is_passthrough(f)]
    runs = variants(names)
    times: dict[str, list[float]] = {name: [] for name in runs}
    tmp = tempfile.mkdtemp(prefix="bench_train_")
    start = time.perf_counter()
    for round_ in range(args.rounds):
        for name, env in runs.items():
            times[name] += step_times(env, args.iters, args.micro_batch_size, os.path.join(tmp, name))
            print(f"round {round_ + 1}/{args.rounds} {name}: median step {statistics.median(times[name]):.3f}s "
                  f"({time.perf_counter() - start:.0f}s elapsed)", flush=True)
    base = statistics.median(times[BASELINE])
    rows = {name: {"median_step_s": statistics.median(t), "ratio_vs_bf16": statistics.median(t) / base,
                   "samples": len(t)} for name, t in times.items()}
    print(f"\n{'variant':<26} {'step (s)':>9} {'vs bf16':>8}")
    for name, row in rows.items():
        print(f"{name:<26} {row['median_step_s']:>9.3f} {row['ratio_vs_bf16']:>7.2f}x")
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg": os.getloadavg()}
    out = Path(__file__).parent / "results" / "bench_train.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "config": vars(args), "results": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
