"""Speed of every format's fake quantization, eager and under torch.compile, against x.clone().

    python bench/bench_formats.py            # 16M elements (4096 x 4096), fp32 and bf16
    python bench/bench_formats.py --quick    # 1M elements, for a smoke run
    python bench/bench_formats.py --device cuda   # on a GPU: GB/s against a device-to-device copy
    python bench/bench_formats.py --device cuda --kernels triton compile torch --dual-axis

Each time is the median of ``--repeats`` runs after a warm-up (which includes compilation; on CUDA the
median of Triton's ``do_bench``, CUDA events with the L2 flushed between runs);
the ratio is against ``x.clone()`` of the same tensor timed in the same run, so it carries
over between machines better than the absolute numbers. Blocks run along the last axis.
Stochastic-rounding rows compare the stateless keyed noise the layers use with a
torch.Generator's (no goal: a reference for the cost of reproducibility).
Goals on CPU (issue 2): compiled elementwise <= 2x clone, block <= 3x; eager <= 4x and 6x.
On CUDA (issue 13): compiled moves >= 80 % of the copy's bandwidth (ratio <= 1.25); eager has no goal.
Triton kernels (issue 21, ``--kernels triton``, CUDA only: on CPU its rows are skipped): >= 85 % of
the copy's bandwidth (ratio <= 1 / 0.85). ``--dual-axis`` adds rows quantizing a 2-D tensor along
both axes (the weight for fprop and dgrad): Triton's one-read kernel (``quantize_for_gemm_both``)
where the format has one, else two single-axis passes; the goal is <= 1.3x the single-axis time.
``--stats`` adds rows quantizing with capture's statistics, at level ``counts`` (the exact fields) and
``full`` (all of them): Triton's kernel takes them in its pass (``quantize_with_stats``), the other
paths quantize and then compute them; the goal is <= 1.1x the single-axis time.
Writes bench/results/bench_formats.json (bench_formats_cuda.json on a GPU).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from megatron.quant.formats import get_format, list_formats

GOALS = {"cpu": {("eager", False): 4.0, ("eager", True): 6.0, ("compiled", False): 2.0, ("compiled", True): 3.0},
         "cuda": {("eager", False): float("inf"), ("eager", True): float("inf"),
                  ("compiled", False): 1.25, ("compiled", True): 1.25,
                  ("triton", False): 1 / 0.85, ("triton", True): 1 / 0.85}}
# --kernels names (CUSTOM_QUANT_KERNELS's) -> row modes
MODES = {"torch": "eager", "compile": "compiled", "triton": "triton"}
RESULTS = Path(__file__).resolve().parent / "results"
# Recipe variants timed beside the formats' defaults (nvfp4's default is the TE kernel arithmetic):
# label -> (format, options); --formats accepts the labels too.
VARIANTS = {
    "nvfp4:16x16": ("nvfp4", {"block_shape": (16, 16)}),
    "nvfp4:hadamard16": ("nvfp4", {"hadamard": 16}),
    "mxfp4:hadamard32": ("mxfp4_e2m1", {"hadamard": 32}),
    "fp8_e4m3:block1x128": ("fp8_e4m3", {"scaling": "block"}),
}


def median_seconds(fn: Callable[[], torch.Tensor], repeats: int, device: str = "cpu") -> float:
    """Median seconds of ``fn`` after a warm-up call (compilation, allocator). On CUDA, Triton's
    ``do_bench``: CUDA events around each run, L2 flushed between runs (a bf16 16M-element tensor fits
    an H100's L2), as many runs as fit ~100 ms, so neither host timers nor launch gaps nor the cache
    flatter a 50-microsecond kernel; ``repeats`` counts the runs on CPU."""
    fn()  # warm-up: compilation, allocator
    if device == "cuda":
        from triton.testing import do_bench

        torch.cuda.synchronize()
        return do_bench(fn, return_mode="median") / 1e3
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def quantizers(fmt, modes: list[str]) -> dict[str, Callable[..., torch.Tensor]]:
    """Row mode -> the format's ``quantize`` run by that backend (``megatron.quant.kernels``)."""
    from megatron.quant import kernels

    out = {}
    for mode in modes:
        if mode == "compiled":
            # A fresh compiled callable per format (CompiledFormat compiles a code object of its own).
            out[mode] = kernels.wrap(fmt, compile=True, chosen="compile").quantize
        elif mode == "triton":
            out[mode] = kernels.wrap(fmt, compile=False, chosen="triton", cuda=True).quantize
        else:
            out[mode] = fmt.quantize
    return out


# the goal of each row kind, as a multiple of the single-axis goal
AXES_FACTORS = {"single-axis": 1.0, "dual-axis": 1.3, "with-counts": 1.1, "with-full-stats": 1.1}


def with_stats(quantize: Callable[..., torch.Tensor], fmt, mode: str, level: str) -> Callable[[torch.Tensor], object]:
    """Quantization with capture's statistics at ``level``, as the layers take them on that path (on the
    device: the transfer to the host is the capture writer's, off the training thread)."""
    from megatron.quant.stats import capture_stats, pack_stats

    owner = getattr(quantize, "__self__", fmt)
    if mode == "triton":
        return lambda x: owner.quantize_with_stats(x, -1, full=level == "full")

    def quantize_then_compute(x: torch.Tensor) -> object:
        q, scale = owner.quantize_with_scale(x, -1)
        if level == "full":
            return pack_stats(x, fmt, -1, q=q, scale=scale)
        return capture_stats(x, fmt, -1, q=q, scale=scale, level=level)

    return quantize_then_compute


def bench_dtype(dtype: torch.dtype, names: list[str], numel: int, repeats: int, modes: list[str],
                device: str, dual_axis: bool, stats: bool = False) -> Iterator[dict]:
    """One row per format, mode and case, as each is measured (bench/gpu's kernels stage keeps them as
    they come)."""
    side = int(numel**0.5)
    x = torch.randn(side, numel // side, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    moved = 2 * x.numel() * x.element_size()  # bytes read + written by a copy and by a quantization
    clone = median_seconds(x.clone, repeats, device)
    print(f"\n{str(dtype):<15} clone: {clone * 1e3:8.2f} ms  ({moved / clone / 1e9:.1f} GB/s moved)", flush=True)
    for name in names:
        format_name, options = VARIANTS.get(name, (name, {}))
        fmt = get_format(format_name, **options)
        for mode, quantize in quantizers(fmt, modes).items():
            cases = {"single-axis": lambda: quantize(x, -1)}
            if dual_axis:
                both = getattr(getattr(quantize, "__self__", None), "quantize_for_gemm_both", None)
                cases["dual-axis"] = (lambda: both(x)) if mode == "triton" and both else \
                    (lambda: (quantize(x, -1), quantize(x, 0)))
            if stats:
                cases["with-counts"] = functools.partial(with_stats(quantize, fmt, mode, "counts"), x)
                cases["with-full-stats"] = functools.partial(with_stats(quantize, fmt, mode, "full"), x)
            for axes, fn in cases.items():
                seconds = median_seconds(fn, repeats, device)
                ratio = seconds / clone
                goal = GOALS[device][(mode, fmt.block_size is not None)] * AXES_FACTORS[axes]
                print(f"  {name:<20} {mode:<9} {axes:<15} {seconds * 1e3:9.2f} ms  {moved / seconds / 1e9:8.1f} GB/s"
                      f"  {ratio:6.2f}x clone  (goal {goal:.2f}x{'' if ratio <= goal else ', missed'})", flush=True)
                yield {"format": name, "dtype": str(dtype).removeprefix("torch."), "mode": mode, "axes": axes,
                       "ms": seconds * 1e3, "elements_per_s": x.numel() / seconds,
                       "GBps": moved / seconds, "copy_GBps": moved / clone,
                       "ratio_to_clone": ratio, "goal": goal, "meets_goal": ratio <= goal}


STOCHASTIC_FORMATS = ("bf16", "hifp8", "mxfp8_e4m3", "nvfp4")


def bench_stochastic(dtype: torch.dtype, numel: int, repeats: int, device: str) -> list[dict]:
    """Eager stochastic rounding with the layers' stateless keyed noise against the same rounding
    fed by a torch.Generator, and the noise alone (hash vs torch.rand), against x.clone()."""
    from megatron.quant.formats.random_bits import RandomBits

    side = int(numel**0.5)
    x = torch.randn(side, numel // side, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    clone = median_seconds(x.clone, repeats, device)
    bits, generator = RandomBits.derive("bench"), torch.Generator(device=device).manual_seed(0)
    cases = {"noise/hash": lambda: bits.uniform(tuple(x.shape), x.device),
             "noise/torch.rand": lambda: torch.rand(x.shape, generator=generator, device=x.device)}
    for name in STOCHASTIC_FORMATS:
        fmt = get_format(name, rounding="stochastic")
        cases[f"{name}/keyed"] = lambda fmt=fmt: fmt.quantize(x, noise=bits)
        cases[f"{name}/generator"] = lambda fmt=fmt: fmt.quantize(x, generator=generator)
    print(f"\n{str(dtype):<15} stochastic rounding, eager (clone {clone * 1e3:.2f} ms)", flush=True)
    rows = []
    for case, fn in cases.items():
        seconds = median_seconds(fn, repeats, device)
        rows.append({"format": case, "dtype": str(dtype).removeprefix("torch."), "mode": "eager-stochastic",
                     "ms": seconds * 1e3, "ratio_to_clone": seconds / clone, "meets_goal": True})
        print(f"  {case:<24} {seconds * 1e3:9.2f} ms  {seconds / clone:6.2f}x clone", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M elements instead of 16M")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per case (median; >= 5)")
    parser.add_argument("--formats", nargs="*", default=None,
                        help=f"subset of formats and variants (default: all; variants: {', '.join(VARIANTS)})")
    parser.add_argument("--eager-only", action="store_true", help="skip torch.compile (same as --kernels torch)")
    parser.add_argument("--kernels", nargs="+", choices=tuple(MODES), default=None,
                        help="backends to time (default: torch compile, plus triton on cuda)")
    parser.add_argument("--dual-axis", action="store_true", help="also quantize along both axes of the tensor")
    parser.add_argument("--stats", action="store_true", help="also quantize with capture's statistics (counts, full)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON path (default bench/results/bench_formats[_cuda].json)")
    args = parser.parse_args()
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    output = args.output or RESULTS / f"bench_formats{'_cuda' if args.device == 'cuda' else ''}.json"
    torch.set_num_threads(args.threads)
    numel = (1 << 20) if args.quick else (1 << 24)
    names = args.formats or list_formats() + list(VARIANTS)
    backends = args.kernels or (["torch"] if args.eager_only else
                                ["torch", "compile"] + (["triton"] if args.device == "cuda" else []))
    if "triton" in backends and args.device != "cuda":
        print("triton rows skipped: Triton kernels are timed on CUDA only (on CPU they run in its interpreter)")
        backends = [b for b in backends if b != "triton"]
    modes = [MODES[b] for b in backends]
    started = time.time()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        rows += bench_dtype(dtype, names, numel, args.repeats, modes, args.device, args.dual_axis, args.stats)
        rows += bench_stochastic(dtype, numel, args.repeats, args.device)
    report = {
        "benchmark": "bench_formats",
        "numel": numel,
        "repeats": args.repeats,
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__, "load_average": os.getloadavg(),
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"},
        "seconds": time.time() - started,
        "results": rows,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2))
    missed = [f"{r['format']}/{r['dtype']}/{r['mode']}" + (f"/{r['axes']}" if r.get("axes", "single-axis") !=
                                                          "single-axis" else "") for r in rows if not r["meets_goal"]]
    print(f"\nwrote {output}; goals missed: {', '.join(missed) or 'none'}")


if __name__ == "__main__":
    main()
