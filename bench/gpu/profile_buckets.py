"""Where a training step's time goes: profiler rows bucketed by kernel or op name.

On a GPU the rows are CUDA kernels (device time), on a CPU aten ops (self time). Names decide, first
rule that matches: our Triton kernels are quantization; cuBLAS/CUTLASS kernels are GEMMs, which on a
GPU include attention's batched products (megatron-core's unfused attention runs them as cuBLAS
batched GEMMs, not told apart by name); softmax and fused attention kernels are attention.
"""
from __future__ import annotations

from typing import Iterable

from megatron.quant.kernels import registry

# megatron.quant.kernels' Triton kernels, named exactly (torch's own kernels contain "elementwise_kernel")
OUR_KERNELS = registry.NAMES
# bucket -> lower-case name fragments, tried in this order
RULES = (
    ("quantization", ("quant",)),
    ("optimizer", ("adam", "multi_tensor", "foreach", "optimizer")),
    ("norms", ("norm", "rms")),
    ("attention", ("softmax", "flash", "fmha", "attention", "sdpa", "aten::bmm", "aten::baddbmm")),
    ("GEMMs", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm", "wgmma")),
)
BUCKETS = tuple(name for name, _ in RULES) + ("other",)


def bucket(name: str) -> str:
    if name in OUR_KERNELS:
        return "quantization"
    lowered = name.lower()
    return next((label for label, fragments in RULES if any(f in lowered for f in fragments)), "other")


def bucket_times(rows: Iterable[tuple[str, float]], steps: int, top: int = 12) -> dict:
    """``(name, seconds)`` rows of ``steps`` steps -> seconds per step and share of each bucket, and the
    ``top`` names by time with their bucket (to check the rules against)."""
    rows = list(rows)
    total = sum(seconds for _, seconds in rows) or 1.0
    per_bucket = dict.fromkeys(BUCKETS, 0.0)
    for name, seconds in rows:
        per_bucket[bucket(name)] += seconds
    return {"steps": steps, "total_s_per_step": total / steps,
            "buckets": {label: {"s_per_step": seconds / steps, "share": seconds / total}
                        for label, seconds in per_bucket.items()},
            "top": [{"name": name[:120], "bucket": bucket(name), "s_per_step": seconds / steps}
                    for name, seconds in sorted(rows, key=lambda row: -row[1])[:top]]}


def profiler_rows(key_averages, cuda: bool) -> list[tuple[str, float]]:
    """(name, seconds) from ``torch.profiler``'s key averages: CUDA kernels' device time on a GPU,
    ops' self CPU time otherwise."""
    from torch.autograd import DeviceType

    if cuda:
        return [(e.key, e.self_device_time_total / 1e6) for e in key_averages
                if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    return [(e.key, e.self_cpu_time_total / 1e6) for e in key_averages if e.self_cpu_time_total > 0]
