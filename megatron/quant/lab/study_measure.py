"""A plan's sizes and estimated times (``describe``), and what the ledger has measured, per device:
each recipe's step time alone, how much longer a run takes when K runs share the GPU, the start-up,
and the plan's size that fits a run into a target time. ``python -m megatron.quant.lab.study
--plan PLAN --ledger LEDGER --measured`` prints it with the plan's ``step_time.measured`` block to
paste (docs/comparing.md).

Step times are the entries' own (``step_s``: the median over a run's log intervals); a recipe's
figure is the median over its runs on that device. A slowdown compares runs of the same recipe at
K at once with its runs alone, the median over the recipes that have both.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from megatron.quant.analysis.runs.ledger import LedgerEntry
from megatron.quant.lab import sweep
from megatron.quant.lab.study_plan import VALIDATION_COST, StudyPlan, waves
from megatron.quant.training import metrics


@dataclass(frozen=True)
class Measured:
    device: str
    runs: int                          # the entries behind the figures
    step_s: dict[str, float]           # recipe -> seconds per iteration, alone
    shared_slowdown: dict[int, float]  # K at once -> times as long as alone
    startup_s: float | None            # a run's wall time less its iterations, alone


def measure(plan: StudyPlan, entries: Sequence[LedgerEntry]) -> list[Measured]:
    """One ``Measured`` per device with timed, finished, non-dry runs of ``plan``'s study."""
    timed = [e for e in entries if e.study == plan.name and not e.dry_run and e.status in sweep.DONE and e.step_s]
    by_device: dict[str, list[LedgerEntry]] = defaultdict(list)
    for entry in timed:
        by_device[entry.device].append(entry)
    found = []
    for device, runs in sorted(by_device.items()):
        steps: dict[tuple[str, int], list[float]] = defaultdict(list)
        for entry in runs:
            steps[entry.recipe, entry.runs_at_once].append(float(entry.step_s))
        alone = {recipe: statistics.median(times) for (recipe, k), times in steps.items() if k == 1}
        ratios: dict[int, list[float]] = defaultdict(list)
        for (recipe, k), times in steps.items():
            if k > 1 and recipe in alone:
                ratios[k].append(statistics.median(times) / alone[recipe])
        startups = [e.wall_s - plan.iteration_equivalents(e.iterations) * e.step_s
                    for e in runs if e.runs_at_once == 1]
        found.append(Measured(device=device, runs=len(runs), step_s=dict(sorted(alone.items())),
                              shared_slowdown={k: statistics.median(r) for k, r in sorted(ratios.items())},
                              startup_s=statistics.median(startups) if startups else None))
    return found


def fitting_iterations(plan: StudyPlan, step_s: float, startup_s: float, target_s: float) -> int:
    """The ``train_iters`` whose run (start-up, training, validation) takes ``target_s`` at ``step_s``."""
    per_iteration = step_s * (1 + plan.eval_iters / plan.eval_interval * VALIDATION_COST)
    return max(0, int((target_s - startup_s) / per_iteration))


def describe_measured(plan: StudyPlan, found: Measured, target_s: float) -> str:
    """The plan's ``step_time.measured`` block for ``found`` and what a run of ``target_s`` holds there."""
    lines = [f"# {found.device}: {found.runs} timed runs of study {plan.name}",
             "  measured:", f"    device: {found.device!r}",
             "    step_s: {" + ", ".join(f"{r}: {s:.5f}" for r, s in found.step_s.items()) + "}"]
    if found.shared_slowdown:
        lines.append("    shared_slowdown: {" + ", ".join(f"{k}: {v:.3f}" for k, v in found.shared_slowdown.items())
                     + "}")
        lines += [f"# {k} at once: each run {v:.2f}x as long as alone, {k / v:.2f}x the throughput "
                  f"({'worth it' if k / v > 1.05 else 'no gain'})" for k, v in found.shared_slowdown.items()]
    if not found.step_s:
        return "\n".join([*lines, "# no run alone yet: nothing to size the plan from"])
    slowest = max(found.step_s, key=found.step_s.__getitem__)
    startup = found.startup_s if found.startup_s is not None else plan.step_time.startup_s
    iterations = fitting_iterations(plan, found.step_s[slowest], startup, target_s)
    tokens = iterations * plan.tokens_per_iteration
    lines.append(f"# start-up {startup:.0f} s (plan's estimate {plan.step_time.startup_s:.0f} s); for the slowest "
                 f"recipe measured ({slowest}, {found.step_s[slowest]:.4f} s/iteration) to run {target_s:.0f} s: "
                 f"train_iters {iterations} = {tokens / 1e6:.0f}M tokens, "
                 f"{tokens / plan.non_embedding_parameters:.1f} per parameter (the plan: {plan.train_iters}, "
                 f"{plan.tokens_per_parameter:.1f})")
    return "\n".join(lines)


def all_runs_seconds(plan: StudyPlan) -> float:
    """All the plan's runs, in waves of its runs at once."""
    return sum(plan.wave_seconds([run.recipe for run in wave]) for wave in waves(plan.order, plan.runs_at_once))


def describe(plan: StudyPlan) -> str:
    """The plan's sizes and per-run estimates, one line each."""
    shape = f"{plan.preset}" + "".join(f", {key} {value}" for key, value in plan.shape_override.items())
    lines = [f"study {plan.name}: {shape}, {plan.non_embedding_parameters / 1e6:.2f}M non-embedding "
             f"parameters ({metrics.num_parameters(plan.shape) / 1e6:.2f}M with the embeddings), {plan.train_iters} "
             f"iterations x {plan.tokens_per_iteration:,} tokens = "
             f"{plan.tokens_per_run / 1e6:.0f}M tokens ({plan.tokens_per_parameter:.1f} per parameter), "
             f"{plan.flops_per_iteration / 1e12:.2f} TFLOP per iteration",
             f"{len(plan.order)} runs: {len(plan.recipes)} recipes x {len(plan.seeds)} seeds; per run "
             + ("(measured on " + plan.step_time.measured_device + " where given, else estimated):"
                if plan.step_time.measured_device else "(estimated: no GPU measurement yet):")]
    lines += [f"  {recipe:<16} {plan.step_seconds(recipe):.3f} s/iteration, {plan.run_seconds(recipe):.0f} s a run"
              + (" (measured)" if recipe in plan.step_time.measured_step_s else "") for recipe in plan.recipes]
    if plan.runs_at_once > 1:
        slowdown = plan.slowdown(plan.runs_at_once)
        how = "measured" if plan.runs_at_once in plan.step_time.shared_slowdown else "assumed until measured"
        lines.append(f"{plan.runs_at_once} runs at once share the GPU, each taking {slowdown:.2f}x as long as alone "
                     f"({how}): {plan.runs_at_once / slowdown:.2f}x the throughput")
    lines.append(f"all runs: {all_runs_seconds(plan) / 60:.0f} minutes = {all_runs_seconds(plan) / 3600:.1f} GPU-hours "
                 f"on one GPU ({plan.runs_at_once} at once)")
    return "\n".join(lines)
