"""Stage ``kernels``: every format's quantization on every path (Triton, torch.compile, eager torch), fp32
and bf16 inputs, single- and dual-axis and with capture statistics in the pass, as % of the copy
bandwidth, against the goals: Triton >= 85 % of copy single-axis, dual-axis <= 1.3x and with
statistics <= 1.1x its single-axis time."""
from __future__ import annotations

import json
import math

import torch

from bench.bench_formats import AXES_FACTORS
from megatron.quant.formats import get_format, list_formats
from megatron.quant.formats.elementwise import CastFormat

from .kernels_worker import DTYPES, plan
from .stage import Context

CASES = tuple(AXES_FACTORS)  # single-axis, dual-axis, with-counts, with-full-stats


NO_WORK = "no work: the input is already in this format"


def no_work(row: dict) -> bool:
    """A cast to the input's own dtype (fp32 of fp32, bf16 of bf16) returns its input: timing it
    measures a call, not a kernel, so it answers no goal (on an H200 such rows read 500-1000 % of copy)."""
    name = row["format"]
    fmt = get_format(name) if name in list_formats() else None
    return isinstance(fmt, CastFormat) and fmt.dtype == getattr(torch, row["dtype"])


def checked(rows: list[dict]) -> list[dict]:
    """bench_formats' rows with ``gbps``, ``pct_of_copy`` and the goal each answers: single-axis rows
    against the copy (bench_formats' goals per path), the others against the same path's single-axis time."""
    single = {(r["format"], r["dtype"], r["mode"]): r["ms"] for r in rows if r["axes"] == "single-axis"}
    out = []
    for row in rows:
        # bench_formats' "GBps" fields are bytes per second
        row = dict(row, gbps=row["GBps"] / 1e9, copy_gbps=row["copy_GBps"] / 1e9,
                   pct_of_copy=100 * row["GBps"] / row["copy_GBps"])
        base = single.get((row["format"], row["dtype"], row["mode"]))
        if no_work(row):
            row.update(ratio_to_single=row["ms"] / base if base else None, goal=None, meets_goal=None, note=NO_WORK)
        elif row["axes"] == "single-axis":
            goal = None if math.isinf(row["goal"]) else f">= {100 / row['goal']:.0f} % of copy"
            row.update(goal=goal, meets_goal=row["meets_goal"] if goal else None)
        elif base is not None and row["mode"] == "triton":
            factor = AXES_FACTORS[row["axes"]]
            row.update(ratio_to_single=row["ms"] / base, goal=f"<= {factor}x single-axis",
                       meets_goal=row["ms"] / base <= factor)
        else:
            row.update(ratio_to_single=row["ms"] / base if base else None, goal=None, meets_goal=None)
        out.append(row)
    return out


def run(context: Context) -> dict:
    rows_path = context.scratch / "rows.jsonl"
    result = context.python("bench.gpu.kernels_worker", str(rows_path), *(["--dry-run"] if context.dry_run else []))
    rows = checked([json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else [])
    chosen = plan(context.dry_run)
    done = {(r["mode"], r["dtype"], r["format"]) for r in rows}
    missing = [f"{mode}/{str(dtype).removeprefix('torch.')}/{name}" for mode in chosen["modes"] for dtype in DTYPES
               for name in chosen["names"] if (mode, str(dtype).removeprefix("torch."), name) not in done]
    return {"numel": chosen["numel"], "repeats": chosen["repeats"], "exit_code": result.returncode,
            "stopped": result.killed, "rows": rows, "not_reached": missing}


def summarize(record: dict) -> list[str]:
    rows = record["rows"]
    copies = {r["dtype"]: r["copy_gbps"] for r in rows}
    lines = [f"{len(rows)} rows; copy " + ", ".join(f"{gbps:.0f} GB/s ({dtype})" for dtype, gbps in copies.items())]
    for mode in dict.fromkeys(r["mode"] for r in rows):
        goals = [r for r in rows if r["mode"] == mode and r["goal"]]
        missed = [r for r in goals if not r["meets_goal"]]
        single = [r["pct_of_copy"] for r in rows if r["mode"] == mode and r["axes"] == "single-axis"]
        lines.append(f"- {mode}: single-axis {min(single, default=0):.0f}-{max(single, default=0):.0f} % of copy; "
                     f"goals met {len(goals) - len(missed)}/{len(goals)}"
                     + (f"; missed: {', '.join(_label(r) for r in missed[:6])}" if missed else "")
                     + (" ..." if len(missed) > 6 else ""))
    if record["not_reached"]:
        lines.append(f"not reached: {len(record['not_reached'])} format/dtype/path groups "
                     f"(first {record['not_reached'][0]})")
    return lines


def _label(row: dict) -> str:
    axes = "" if row["axes"] == "single-axis" else f" {row['axes']}"
    return f"{row['format']}/{row['dtype']}{axes} ({row['pct_of_copy']:.0f} %)"
