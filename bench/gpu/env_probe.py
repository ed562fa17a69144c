"""``python -m bench.gpu.env_probe JSON [--dry-run]``: the machine as the check sees it, into JSON.

Device, memory, versions, which of our dependencies import, and the two ceilings the other stages
are read against: device-to-device copy bandwidth (bytes read + written) and bf16 GEMM TFLOP/s.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
from pathlib import Path

import torch

from bench.bench_formats import median_seconds

# import name -> distribution name: setup.py's requirements, its test extra, and the package itself
DEPENDENCIES = {
    "megatron.core": "megatron-core", "megatron.quant": "megatron-quant", "numpy": "numpy", "yaml": "pyyaml",
    "matplotlib": "matplotlib", "scipy": "scipy", "tensorboard": "tensorboard", "safetensors": "safetensors",
    "tqdm": "tqdm", "psutil": "psutil", "ml_dtypes": "ml_dtypes", "en_dtypes": "en_dtypes",
    "transformers": "transformers", "triton": "triton", "pytest": "pytest", "xdist": "pytest-xdist",
}
# (copy bytes, GEMM side): a copy far larger than L2, a GEMM that fills the chip; toy sizes on CPU
SIZES = {"cuda": (1 << 30, 8192), "cpu": (1 << 22, 256)}


def imports() -> dict[str, str]:
    """Each dependency's version, or why it does not import."""
    found = {}
    for module, distribution in DEPENDENCIES.items():
        try:
            importlib.import_module(module)
        except Exception as err:  # an import can fail in many ways; each is reported, none stops the probe
            found[module] = f"does not import: {type(err).__name__}: {err}"
            continue
        try:
            found[module] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            found[module] = "imports (no installed metadata: from the working tree)"
    return found


def ceilings(device: str) -> dict[str, float]:
    """Copy GB/s (read + written) and bf16 GEMM TFLOP/s, medians of timed runs after a warm-up (bench_formats')."""
    copy_bytes, side = SIZES[device]
    x = torch.randn(copy_bytes // 4, device=device)
    y = torch.empty_like(x)
    copy_s = median_seconds(lambda: y.copy_(x), 10, device)
    a, b = (torch.randn(side, side, device=device, dtype=torch.bfloat16) for _ in range(2))
    gemm_s = median_seconds(lambda: a @ b, 10, device)
    return {"copy_bytes": 2 * copy_bytes, "copy_gbps": 2 * copy_bytes / copy_s / 1e9,
            "gemm_side": side, "gemm_bf16_tflops": 2 * side**3 / gemm_s / 1e12}


def probe(device: str) -> dict:
    cuda = device == "cuda"
    properties = torch.cuda.get_device_properties(0) if cuda else None
    return {"device_name": properties.name if cuda else platform.processor() or platform.machine(),
            "memory_gib": properties.total_memory / 2**30 if cuda else None,
            "multiprocessors": properties.multi_processor_count if cuda else None,
            "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "dependencies": imports(), **ceilings(device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, toy sizes")
    args = parser.parse_args()
    args.json.write_text(json.dumps(probe("cpu" if args.dry_run else "cuda"), indent=1))


if __name__ == "__main__":
    main()
