"""Stage ``env``: the machine, versions, dependencies, copy bandwidth and bf16 GEMM rate."""
from __future__ import annotations

import json

from .stage import Context


def run(context: Context) -> dict:
    path = context.scratch / "env.json"
    result = context.python("bench.gpu.env_probe", str(path), *(["--dry-run"] if context.dry_run else []))
    if result.killed:
        return {"stopped": True}
    if result.returncode:
        raise RuntimeError(f"env_probe exited {result.returncode}: {result.output.strip().splitlines()[-1:]}")
    return json.loads(path.read_text())


def summarize(record: dict) -> list[str]:
    if "copy_gbps" not in record:
        return ["no result (stopped)"]
    missing = [m for m, v in record["dependencies"].items() if v.startswith("does not import")]
    memory = f", {record['memory_gib']:.0f} GiB" if record["memory_gib"] else ""
    return [f"{record['device_name']}{memory}; Python {record['python']}, torch {record['torch']}, CUDA "
            f"{record['cuda']}, Triton {record['dependencies']['triton']}",
            f"copy {record['copy_gbps']:.0f} GB/s (read + written); bf16 GEMM {record['gemm_bf16_tflops']:.3g} TFLOP/s",
            f"dependencies that do not import: {', '.join(missing) or 'none'}"]
