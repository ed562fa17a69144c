"""Stage ``train``: Llama 3.2 1B, seq 2048, mock data: the bf16 baseline and each preset, one process per
run, median step time after warm-up, MFU and the ratio to bf16, whose runs are interleaved with the
presets' (ratios within one check); the kernel path each run's start line names; and where each run's
time goes (``torch.profiler`` on 2 more steps, bucketed by kernel name, and the share of the step the
device was busy: well under 1, the host sets the pace). Then a mixture of
experts (DeepSeek-V3-style, megatron-core's MoE layers) in bf16 and under its own presets, each ratio
against the bf16 run of its own model."""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass

from .stage import Context

BASELINE = "bf16"


@dataclass(frozen=True)
class Plan:
    model: str
    seq_length: int
    micro_batch_size: int  # two micro-batches per step
    bf16: bool
    iters: int             # per run; the first ``warmup`` are not timed
    warmup: int
    profile_steps: int     # after each run's timed steps
    variants: tuple[str, ...]
    baseline_every: int    # a baseline run before every group of this many variants
    run_estimate_s: float  # one run's process, start to end: a run that would not fit the stage's time is skipped
    moe_model: str         # after the dense model's runs: its baseline, then ``moe_variants``
    moe_variants: tuple[str, ...]


COLD = Plan("llama3.2-1b", 2048, 2, True, iters=6, warmup=2, profile_steps=2,
            variants=("te-mxfp8", "te-nvfp4", "te-fp8-current", "te-fp8-delayed", "te-fp8-blockwise", "mxfp4", "hifp8"),
            baseline_every=4, run_estimate_s=24, moe_model="deepseek-v3-small", moe_variants=("deepseek-v3-fp8",))
DRY_RUN = Plan("llama-tiny", 64, 1, False, iters=3, warmup=1, profile_steps=1, variants=("hifp8",),
               baseline_every=4, run_estimate_s=6, moe_model="llama-moe-tiny", moe_variants=("deepseek-v3-fp8",))
# "kernels auto: triton mxfp8_e4m3; compiled nvfp4 (WARNING: ...)" in the start line, up to the next field
KERNEL_PATH = re.compile(r"(?:^|\| )(kernels [\w-]+: .*?)(?= \| |$)", re.MULTILINE)


def schedule(plan: Plan) -> list[tuple[str, str]]:
    """Run order as (model, variant): the baseline, then ``baseline_every`` variants, the baseline again,
    and so on; then the mixture of experts' baseline and variants."""
    order = []
    for start in range(0, len(plan.variants), plan.baseline_every):
        order += [BASELINE, *plan.variants[start:start + plan.baseline_every]]
    return ([(plan.model, variant) for variant in order or [BASELINE]]
            + [(plan.moe_model, variant) for variant in (BASELINE, *plan.moe_variants)])


def kernel_path(output: str) -> str | None:
    """The start line's kernel path, as megatron-quant prints it."""
    found = KERNEL_PATH.search(output)
    return found.group(1).strip() if found else None


def _one_run(context: Context, plan: Plan, model: str, variant: str, index: int) -> dict:
    path = context.scratch / f"run{index}.json"
    args = [str(path), "--variant", variant, "--model", model, "--seq-length", str(plan.seq_length),
            "--micro-batch-size", str(plan.micro_batch_size), "--iters", str(plan.iters),
            "--profile-steps", str(plan.profile_steps)] + (["--bf16"] if plan.bf16 else [])
    result = context.python("bench.gpu.train_worker", *args)
    record = {"model": model, "variant": variant, "exit_code": result.returncode, "seconds": result.seconds,
              "kernel_path": kernel_path(result.output)}
    if result.returncode != 0 or not path.exists():
        tail = [line for line in result.output.splitlines() if line.strip()][-3:]
        return dict(record, error="killed at the deadline" if result.killed else " / ".join(tail))
    data = json.loads(path.read_text())
    timed = data["history"][plan.warmup:]
    return dict(record, step_s=statistics.median(h["iteration time (s)"] for h in timed),
                steps_s=[h["iteration time (s)"] for h in timed],
                mfu=statistics.median(h["MFU"] for h in timed) if data["peak_tflops"] else None,
                tflops=statistics.median(h["TFLOP/s/device"] for h in timed), peak_tflops=data["peak_tflops"],
                loss_last=data["history"][-1]["lm loss"], profile=data["profile"])


def rows(runs: list[dict], cuda: bool) -> list[dict]:
    """One row per model and variant: median step, MFU, ratio to the median of that model's baseline runs."""
    done = [r for r in runs if "step_s" in r]
    out = []
    for model, variant in dict.fromkeys((r["model"], r["variant"]) for r in runs):
        baseline = [r["step_s"] for r in done if (r["model"], r["variant"]) == (model, BASELINE)]
        base = statistics.median(baseline) if baseline else None
        mine = [r for r in done if (r["model"], r["variant"]) == (model, variant)]
        failed = [r for r in runs if (r["model"], r["variant"]) == (model, variant) and "step_s" not in r]
        if not mine:
            out.append({"model": model, "variant": variant, "error": failed[0]["error"],
                        "kernel_path": failed[0]["kernel_path"]})
            continue
        step = statistics.median(r["step_s"] for r in mine)
        mfus = [r["mfu"] for r in mine if r["mfu"] is not None]
        path = mine[0]["kernel_path"] or ""
        out.append({"model": model, "variant": variant, "step_s": step,
                    "mfu": statistics.median(mfus) if mfus else None,
                    "tflops": statistics.median(r["tflops"] for r in mine),
                    "ratio_to_bf16": step / base if base else None, "runs": len(mine),
                    "steps_s": [r["step_s"] for r in mine], "kernel_path": mine[0]["kernel_path"],
                    "eager_on_gpu": cuda and ("eager" in path.split(": ", 1)[-1] or "WARNING" in path),
                    "loss_last": mine[-1]["loss_last"], **_where_time_went(mine[0], step)})
    return out


def _where_time_went(run: dict, step_s: float) -> dict:
    """A run's profile as row fields: seconds per step by bucket, and ``busy``, the profiled kernel
    time over the timed step (on a CPU the ops' self time: near 1)."""
    profile = run.get("profile")
    if not profile:
        return {}
    return {"bucket_s": {name: b["s_per_step"] for name, b in profile["buckets"].items()},
            "busy": profile["total_s_per_step"] / step_s}


def run(context: Context) -> dict:
    plan = DRY_RUN if context.dry_run else COLD
    runs, skipped = [], []
    for index, (model, variant) in enumerate(schedule(plan)):
        if context.remaining() < plan.run_estimate_s:
            skipped.append(f"{model} {variant}")
            continue
        runs.append(_one_run(context, plan, model, variant, index))
    peak = next((r["peak_tflops"] for r in runs if r.get("peak_tflops")), None)
    profile = runs[0].get("profile") if runs else None
    return {"plan": asdict(plan), "stopped": any(r["exit_code"] is None for r in runs),
            "mfu_of": f"the device's dense bf16 datasheet peak, {peak:g} TFLOP/s (training.metrics.PEAK_BF16_TFLOPS, "
                      "as in docs/results.md)" if peak else "none: no peak known for this device",
            "rows": rows(runs, not context.dry_run),
            "runs": [{k: v for k, v in r.items() if k != "profile"} for r in runs],
            "skipped_runs": skipped, "baseline_profile": profile}


def summarize(record: dict) -> list[str]:
    lines = ["| model | variant | step (s) | MFU | vs bf16 | kernel path |", "|---|---|---|---|---|---|"]
    for row in record["rows"]:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['variant']} | failed: {row['error'][:80]} | | | "
                         f"{row['kernel_path']} |")
            continue
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        ratio = f"{row['ratio_to_bf16']:.2f}x" if row["ratio_to_bf16"] else "-"
        eager = " **EAGER ON GPU**" if row["eager_on_gpu"] else ""
        lines.append(f"| {row['model']} | {row['variant']} | {row['step_s']:.3f} | {mfu} | {ratio} | "
                     f"{row['kernel_path']}{eager} |")
    lines.append(f"MFU against {record['mfu_of']}.")
    if record["skipped_runs"]:
        lines.append(f"skipped runs (time): {', '.join(record['skipped_runs'])}")
    profiled = [row for row in record["rows"] if "bucket_s" in row]
    if profiled:
        buckets = list(profiled[0]["bucket_s"])
        lines += ["", "Where a step goes (ms by kernel bucket; busy: kernel time over the step):", "",
                  "| model | variant | " + " | ".join(buckets) + " | busy |", "|---|---|" + "---|" * (len(buckets) + 1)]
        for row in profiled:
            ms = " | ".join(f"{row['bucket_s'][name] * 1e3:.1f}" for name in buckets)
            lines.append(f"| {row['model']} | {row['variant']} | {ms} | {row['busy']:.0%} |")
    return lines
