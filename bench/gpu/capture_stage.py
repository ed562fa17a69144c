"""Stage ``capture``: what capture costs a training step on the device (bench/bench_saver.py): statistics
of every iteration and of every 10th against no capture, and full capture of one iteration: the training
thread's wait as a share of a step and the disk write speed."""
from __future__ import annotations

import json
import sys

from .stage import Context

# bench_saver's arguments: Llama 3.2 1B's widths at 2 layers (one full iteration is a few GB, not 32)
COLD_ARGS = ("--device", "cuda", "--model", "1b-2layers", "--rounds", "3")
DRY_RUN_ARGS = ("--device", "cpu", "--model", "llama-tiny", "--rounds", "1", "--microbatches", "1", "--batch", "1")


def run(context: Context) -> dict:
    path = context.scratch / "saver.json"
    args = DRY_RUN_ARGS if context.dry_run else COLD_ARGS
    result = context.command([sys.executable, "bench/bench_saver.py", *args, "--out", str(path)])
    if result.killed:
        return {"stopped": True, "command": f"bench/bench_saver.py {' '.join(args)}"}
    if result.returncode:
        raise RuntimeError(f"bench_saver exited {result.returncode}: {result.output.strip().splitlines()[-1:]}")
    saver = json.loads(path.read_text())
    return {"command": f"bench/bench_saver.py {' '.join(args)}", "model": saver["model"], "format": saver["format"],
            "off_step_s": saver["step_s_by_clock"]["off"],
            "stats_every_iteration_ratio": 1 + saver["stats_overhead"],
            "stats_every10_ratio": 1 + saver["stats_every10_overhead"],
            "stats_ratio_by_level": {level: 1 + v for level, v in saver["stats_overhead_by_level"].items()},
            "full_wait_pct_of_step": 100 * saver["full_wait_fraction"],
            "full_bytes_per_iteration": saver["bytes_per_full_iteration"],
            "full_write_gbps_at_least": saver["full_write_gbps_at_least"], "bench_saver": saver}


def summarize(record: dict) -> list[str]:
    if "off_step_s" not in record:
        return ["no result (stopped)"]
    return [f"{record['model']}, {record['format']}: step {record['off_step_s']:.3f} s without capture; statistics "
            f"every iteration {record['stats_every_iteration_ratio']:.2f}x, "
            f"every 10th {record['stats_every10_ratio']:.2f}x",
            f"full capture of one iteration: {record['full_bytes_per_iteration'] / 1e9:.2f} GB, the training thread "
            f"waited {record['full_wait_pct_of_step']:.0f} % of a step; "
            f"disk >= {record['full_write_gbps_at_least']:.2f} GB/s"]
