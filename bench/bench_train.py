"""Training step time: each format, compile and capture mode vs bf16 (no fake quantization).

Every variant is a real ``megatron-quant-train`` run (``main(argv)``: data, DDP, optimizer,
logging); the step time is the median of its iterations after warm-up. Variants run in
interleaved rounds so machine noise hits all alike; ratios are against the bf16 baseline
of the same run.

    python bench/bench_train.py [--iters 8] [--rounds 2] [--formats hifp8,mxfp8_e4m3]
    python bench/bench_train.py --model llama3.2-1b --seq-length 2048 --bf16 --rounds 1 --iters 4 \
        --variants bf16,mxfp8+compile,hifp8+compile+stats          # one GPU
    python bench/bench_train.py --model llama-moe-tiny --variants bf16,mxfp8,deepseek-v3-fp8   # the MoE model
A variant is FORMAT[+compile][+linear][+stats|+full][@CHECKOUT]: CUSTOM_QUANT_COMPILE=1, only the linear
layers quantized (CUSTOM_QUANT_SCOPE=linear: attention keeps megatron-core's fused path), capture of
every iteration after the first in stats mode or (full) of iteration 2 only, and the package imported
from another checkout (e.g. ``git archive REV | tar -x -C /tmp/rev``) to compare code versions in one run:

    python bench/bench_train.py --variants bf16,mxfp8,bf16@/tmp/rev,mxfp8@/tmp/rev --rounds 3
Writes bench/results/bench_train.json (bench_train_cuda.json on a GPU).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

BASELINE = "bf16"
CHECKOUT = "BENCH_TRAIN_CHECKOUT"  # a variant's other checkout: its package is imported first


_CAPTURE = {"stats": {"TENSOR_SAVE_MODE": "stats", "TENSOR_SAVER_ITERATION": "1-1000"},
            "full": {"TENSOR_SAVE_MODE": "full", "TENSOR_SAVER_ITERATION": "2"}}


def variant_env(spec: str) -> dict:
    """FORMAT[+compile][+linear][+stats|+full][@CHECKOUT] -> environment."""
    spec, _, checkout = spec.partition("@")
    if checkout and not (Path(checkout) / "megatron" / "quant").is_dir():
        raise SystemExit(f"bench_train: {checkout!r} holds no megatron/quant package (a checkout of this repository)")
    fmt, *flags = spec.split("+")
    env = {"CUSTOM_QUANT_TYPE": fmt}
    for flag in flags:
        if flag == "compile":
            env["CUSTOM_QUANT_COMPILE"] = "1"
        elif flag == "linear":
            env["CUSTOM_QUANT_SCOPE"] = "linear"
        elif flag in _CAPTURE:
            env.update(_CAPTURE[flag], TENSOR_SAVE_ENABLED="true")
        else:
            raise SystemExit(f"bench_train: unknown variant flag {flag!r} in {spec!r} "
                             "(allowed: compile, linear, stats, full)")
    return {**env, CHECKOUT: checkout} if checkout else env


def default_variants(format_names: list[str]) -> list[str]:
    return [BASELINE, *format_names, "hifp8+stats", "hifp8+full"]


def train_argv(model: str, iters: int, micro_batch_size: int, seq_length: int | None, bf16: bool) -> list[str]:
    """The training run's arguments: mock data, no evaluation, two micro-batches per step."""
    argv = ["--model", model, "--mock-data", "--train-iters", str(iters), "--eval-iters", "0",
            "--micro-batch-size", str(micro_batch_size), "--global-batch-size", str(2 * micro_batch_size),
            "--log-interval", "1"]  # per-iteration times: the loop reads back (and times) once per window
    argv += ["--seq-length", str(seq_length)] if seq_length else []
    return argv + (["--bf16"] if bf16 else [])


def step_times(env: dict, args: argparse.Namespace, save_dir: str) -> list[dict]:
    """Per timed iteration: step time, MFU (when known) and the saver's wait."""
    if env.get(CHECKOUT):  # this fresh process has imported nothing of the package yet
        sys.path.insert(0, env[CHECKOUT])
    from megatron.quant.training.main import main

    # The process is this run's alone (in_fresh_process): its environment needs no restoring, and setting
    # it needs nothing of the package, whose helpers differ between the checkouts compared.
    os.environ.update(env, TENSOR_SAVE_DIR=save_dir)
    argv = train_argv(args.model, args.iters, args.micro_batch_size, args.seq_length, args.bf16)
    try:
        history = main(argv)
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)
    return history[1:]  # the first iteration warms up (and compiles)


def main() -> None:
    from megatron.quant import formats

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--formats", default=None, help="comma-separated; default: every non-passthrough format")
    p.add_argument("--variants", default=None,
                   help="comma-separated FORMAT[+compile][+linear][+stats|+full]; "
                        "default: bf16, --formats, hifp8+stats, hifp8+full")
    p.add_argument("--model", default="llama-tiny", help="preset (default llama-tiny)")
    p.add_argument("--seq-length", type=int, default=None)
    p.add_argument("--bf16", action="store_true", help="bf16 parameters (GPU runs)")
    p.add_argument("--output", type=Path, default=None,
                   help="results JSON (default bench/results/bench_train.json, bench_train_cuda.json on a GPU)")
    args = p.parse_args()
    names = (args.formats.split(",") if args.formats
             else [f for f in formats.list_formats() if not formats.is_passthrough(f)])
    specs = args.variants.split(",") if args.variants else default_variants(names)
    if BASELINE not in specs:
        specs.insert(0, BASELINE)
    runs = {spec: variant_env(spec) for spec in specs}
    samples: dict[str, list[dict]] = {name: [] for name in runs}
    tmp = tempfile.mkdtemp(prefix="bench_train_")
    start = time.perf_counter()
    for round_ in range(args.rounds):
        for name, env in runs.items():
            samples[name] += in_fresh_process(step_times, env, args, os.path.join(tmp, name))
            median = statistics.median(h["iteration time (s)"] for h in samples[name])
            print(f"round {round_ + 1}/{args.rounds} {name}: median step {median:.3f}s "
                  f"({time.perf_counter() - start:.0f}s elapsed)", flush=True)
    rows = {name: _summary(history) for name, history in samples.items()}
    base = rows[BASELINE]["median_step_s"]
    print(f"\n{'variant':<26} {'step (s)':>9} {'vs bf16':>8} {'min (s)':>8} {'MFU':>6} {'saver wait':>11}")
    for name, row in rows.items():
        row["ratio_vs_bf16"] = row["median_step_s"] / base
        print(f"{name:<26} {row['median_step_s']:>9.3f} {row['ratio_vs_bf16']:>7.2f}x {row['min_step_s']:>8.3f} "
              f"{row['mfu']:>6.3f} {row['saver_wait_fraction']:>10.1%}")
    cuda = torch.cuda.is_available()
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg": os.getloadavg(), "device": torch.cuda.get_device_name() if cuda else "cpu"}
    out = args.output or Path(__file__).parent / "results" / f"bench_train{'_cuda' if cuda else ''}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "config": vars(args), "results": rows}, indent=1, default=str))
    print(f"wrote {out}")


def in_fresh_process(fn, *args):
    """Each run in its own process: no compile caches, allocator pools or parallel state carry over
    from one variant to the next (on a GPU, a second 1B model in one process would not fit)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _summary(history: list[dict]) -> dict:
    """Median step time and MFU; for captured iterations, the share of the step spent waiting for the writer."""
    steps = [h["iteration time (s)"] for h in history]
    captured = [h for h in history if "capture/wait_s" in h]
    wait = max((h["capture/wait_s"] / h["iteration time (s)"] for h in captured), default=float("nan"))
    return {"median_step_s": statistics.median(steps), "min_step_s": min(steps), "samples": len(steps),
            "mfu": statistics.median(h.get("MFU", float("nan")) for h in history),
            "captured_step_s": statistics.median(h["iteration time (s)"] for h in captured) if captured else None,
            "saver_wait_fraction": wait}


if __name__ == "__main__":
    main()
