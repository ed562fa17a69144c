"""Stage ``correct``: the device suite and the kernel tests on CUDA (``pytest --device cuda -m device
tests/device tests/kernels``), one xdist worker per CPU core so that Triton compiles in parallel."""
from __future__ import annotations

import json
import os
import shlex
from collections import Counter

from .pytest_rows import ROWS_ENV
from .stage import Context

TEST_PATHS = ("tests/device", "tests/kernels")
# --dry-run: one quick file of the device suite, on the CPU, in this process's one worker
DRY_RUN_SELECTION = ("tests/device/test_formats_device.py", "-k", "hifp8 and float32")


def pytest_argv(dry_run: bool, workers: int) -> list[str]:
    """The pytest arguments (after ``python -m pytest``)."""
    common = ["-m", "device", "-p", "bench.gpu.pytest_rows", "-p", "no:cacheprovider", "-q"]
    if dry_run:
        return ["--device", "cpu", *common, *DRY_RUN_SELECTION]
    return ["--device", "cuda", *common, "-n", str(workers), *TEST_PATHS]


def run(context: Context) -> dict:
    rows_path = context.scratch / "tests.jsonl"
    argv = pytest_argv(context.dry_run, os.cpu_count() or 1)
    result = context.python("pytest", *argv, env={ROWS_ENV: str(rows_path)})
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    counts = Counter(row["outcome"] for row in rows)
    return {"command": shlex.join(["python", "-m", "pytest", *argv]), "exit_code": result.returncode,
            "stopped": result.killed, "counts": {k: counts[k] for k in ("passed", "failed", "error", "skipped")},
            "failures": [row for row in rows if row["outcome"] in ("failed", "error")],
            "skip_reasons": dict(Counter(row["reason"] for row in rows if row["outcome"] == "skipped"))}


def summarize(record: dict) -> list[str]:
    counts = record["counts"]
    lines = [f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
             f"{counts['skipped']} skipped (pytest exit {record['exit_code']})"]
    lines += [f"- FAILED {row['id']}: {row['reason']}" for row in record["failures"][:10]]
    if len(record["failures"]) > 10:
        lines.append(f"- ... {len(record['failures']) - 10} more in correct.json")
    return lines
