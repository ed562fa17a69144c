"""Sizing a study tier on the device it runs on: measure the step of the plan's recipes at two model
sizes with the plan's runs at once and one recipe alone, fit each recipe's step as a launch-bound
constant plus a FLOP term, keep the largest candidate size whose runs all fit the time left at the
plan's tokens per parameter, and write that size into the plan.

A tiny model leaves a GPU idle between one process's kernel launches, so its step hardly grows with
its FLOPs, and several processes may share the GPU at almost no cost each: both are measured here,
not assumed. The measuring runs are ordinary sweep runs (``OUT/sizing/<preset>-k<K>/``) of
``Sizing.measure_iters`` iterations; a recipe's step is the median of its log intervals after the
first (which holds the kernels' compilation), its start-up the rest of its wall time.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from megatron.quant.analysis.runs.read import TOKENS_PER_S, read_scalars
from megatron.quant.lab import sweep
from megatron.quant.lab.machine import seconds_between
from megatron.quant.lab.plan_checks import SIZED_LINES
from megatron.quant.lab.study_measure import all_runs_seconds
from megatron.quant.lab.study_plan import StudyPlan, StudyPlanError, non_embedding_parameters
from megatron.quant.lab.sweep_plan import TENSORBOARD
from megatron.quant.training.presets import get_preset

SAFETY = 0.85  # of the time left: the tier is sized to finish with a margin
MEASURE_LOG_INTERVAL = 5


@dataclass(frozen=True)
class Measurement:
    """One measuring wave: each recipe's seconds per iteration and start-up, ``at_once`` runs sharing the GPU."""

    preset: str
    at_once: int
    step_s: Mapping[str, float]
    startup_s: Mapping[str, float]


@dataclass(frozen=True)
class Choice:
    """A candidate size with its predicted tier time."""

    preset: str
    train_iters: int
    parameters: int
    tier_s: float
    fits: bool


@dataclass(frozen=True)
class SizingResult:
    measurements: tuple[Measurement, ...]
    shared_slowdown: float            # step at the plan's runs_at_once over the step alone (the recipe measured alone)
    choices: tuple[Choice, ...]       # every candidate, smallest first
    chosen: Choice | None             # the largest that fits; None when none does
    budget_s: float
    plan: StudyPlan | None            # the chosen size's plan, its step times the measured ones

    def as_json(self) -> dict:
        return {"measurements": [{**dataclasses.asdict(m), "step_s": dict(m.step_s), "startup_s": dict(m.startup_s)}
                                 for m in self.measurements],
                "shared_slowdown": self.shared_slowdown,
                "budget_s": round(self.budget_s) if math.isfinite(self.budget_s) else None,
                "choices": [dataclasses.asdict(c) for c in self.choices],
                "chosen": dataclasses.asdict(self.chosen) if self.chosen else None}


def measurement_flags(plan: StudyPlan, flags: Sequence[str], preset: str, dry_run: bool) -> list[str]:
    """``flags`` with the model and the length of a measuring run (argparse: the last value given wins;
    a dry run keeps its toy model)."""
    iters = str(plan.sizing.measure_iters)
    return [*flags, *(() if dry_run else ("--model", preset)), "--train-iters", iters, "--log-interval",
            str(MEASURE_LOG_INTERVAL), "--eval-interval", iters, "--eval-iters", "1", "--save-interval", iters,
            "--lr-warmup-iters", "0"]


def read_measurement(runs_dir: Path, names: Mapping[str, str], preset: str, at_once: int,
                     tokens_per_iteration: int, iterations: int) -> Measurement:
    """The step and start-up of each finished run in ``runs_dir`` (``names``: recipe -> run name)."""
    step, startup = {}, {}
    for recipe, name in names.items():
        record = sweep.read_run(runs_dir / name) or {}
        if record.get("status") not in sweep.DONE:
            continue
        speeds = read_scalars(runs_dir / name / TENSORBOARD).get(TOKENS_PER_S, (None, []))[1]
        if len(speeds) < 2:
            continue
        step[recipe] = tokens_per_iteration / float(statistics.median(list(speeds)[1:]))
        attempt = record["attempts"][-1]
        wall = seconds_between(attempt["start_time"], attempt["end_time"])
        startup[recipe] = max(0.0, wall - iterations * step[recipe])
    return Measurement(preset=preset, at_once=at_once, step_s=step, startup_s=startup)


def flops(plan: StudyPlan, preset: str) -> float:
    """An iteration's FLOPs at ``preset`` with the plan's batch and sequence."""
    return dataclasses.replace(plan, preset=preset).flops_per_iteration


def step_model(small: Measurement, large: Measurement, plan: StudyPlan) -> dict[str, Callable[[float], float]]:
    """Per recipe measured at both sizes: its step as a function of an iteration's FLOPs, a constant
    (launches) plus a FLOP term through the two points (never decreasing with the FLOPs)."""
    f_small, f_large = flops(plan, small.preset), flops(plan, large.preset)
    models = {}
    for recipe in small.step_s.keys() & large.step_s.keys():
        s, l = small.step_s[recipe], large.step_s[recipe]
        slope = max(0.0, (l - s) / (f_large - f_small)) if f_large != f_small else 0.0
        base = max(s, l) if slope == 0.0 else s - slope * f_small
        models[recipe] = lambda f, base=base, slope=slope: base + slope * f
    return models


def iterations_for(plan: StudyPlan, preset: str) -> int:
    """Iterations that give ``preset`` the plan's tokens per (non-embedding) parameter."""
    tokens = plan.sizing.tokens_per_parameter * non_embedding_parameters(get_preset(preset))
    return math.ceil(tokens / plan.tokens_per_iteration)


def evaluations(plan: StudyPlan, train_iters: int) -> int:
    """The eval interval that gives a sized run the plan's number of validations (at least one)."""
    return max(1, train_iters // max(1, plan.train_iters // plan.eval_interval))


def with_size(plan: StudyPlan, preset: str, models: Mapping[str, Callable[[float], float]], slowdown: float,
              startup_s: float, device: str) -> StudyPlan:
    """``plan`` at ``preset`` (its iterations for the plan's tokens per parameter), its step times those
    ``models`` predict there with ``slowdown`` at its runs at once, and the measured start-up; so the
    plan's own ``wave_seconds`` predicts the sized runs."""
    iters = iterations_for(plan, preset)
    sized = dataclasses.replace(plan, preset=preset, train_iters=iters, eval_interval=evaluations(plan, iters))
    at_once = plan.runs_at_once
    f = sized.flops_per_iteration
    step_time = dataclasses.replace(
        plan.step_time, measured_device=device, startup_s=startup_s / (slowdown if at_once > 1 else 1.0),
        measured_step_s={recipe: models[recipe](f) / slowdown for recipe in plan.recipes},
        shared_slowdown={**plan.step_time.shared_slowdown, **({at_once: slowdown} if at_once > 1 else {})})
    return dataclasses.replace(sized, step_time=step_time)


def choose(plan: StudyPlan, models: Mapping[str, Callable[[float], float]], slowdown: float, startup_s: float,
           device: str, budget_s: float) -> list[tuple[Choice, StudyPlan]]:
    """Every candidate, smallest first, with its sized plan and whether all its runs fit within
    ``SAFETY`` of ``budget_s``."""
    missing = sorted(set(plan.recipes) - set(models))
    if missing:
        raise StudyPlanError(f"sizing: no step measured at both sizes for {', '.join(missing)}: their measuring runs "
                             f"did not finish")
    choices = []
    for preset in plan.sizing.candidates:
        sized = with_size(plan, preset, models, slowdown, startup_s, device)
        tier = all_runs_seconds(sized)
        choices.append((Choice(preset=preset, train_iters=sized.train_iters, parameters=sized.non_embedding_parameters,
                               tier_s=round(float(tier), 1), fits=bool(tier <= SAFETY * budget_s)), sized))
    return choices


def size(plan: StudyPlan, measure: Callable[[str, Sequence[str], int], Measurement], device: str,
         budget_left: Callable[[], float], say: Callable[[str], None]) -> SizingResult:
    """Measure (``measure(preset, recipes, at_once)`` trains a measuring wave) the plan's recipes at its two
    measured sizes with its runs at once, and ``Sizing.alone`` alone at the larger; then choose the
    largest candidate whose runs fit what ``budget_left()`` gives after the measuring."""
    small_preset, large_preset = plan.sizing.measured
    small = measure(small_preset, plan.recipes, plan.runs_at_once)
    say(_describe(small))
    large = measure(large_preset, plan.recipes, plan.runs_at_once)
    say(_describe(large))
    recipe = plan.sizing.alone
    alone = measure(large_preset, (recipe,), 1)
    say(_describe(alone))
    if recipe in large.step_s and recipe in alone.step_s:
        slowdown = large.step_s[recipe] / alone.step_s[recipe]
        say(f"{plan.runs_at_once} runs at once: each step {slowdown:.2f}x the step alone ({recipe} at {large_preset}), "
            f"{plan.runs_at_once / slowdown:.2f}x the throughput of one run"
            + ("" if plan.runs_at_once / slowdown > 1.05 else ": no better than one run at a time"))
    else:  # the tier's time comes from the steps measured at its runs at once; only the report lacks this
        slowdown = float(plan.runs_at_once)
        say(f"{recipe} alone was not measured: the gain of {plan.runs_at_once} runs at once is unknown")
    startups = [*small.startup_s.values(), *large.startup_s.values()]
    startup = max(startups) if startups else plan.step_time.startup_s
    budget = budget_left()
    choices = choose(plan, step_model(small, large, plan), slowdown, startup, device, budget)
    for c, _ in choices:
        say(f"{c.preset}: {c.parameters / 1e6:.2f}M parameters, {c.train_iters} iterations, the tier "
            f"~{c.tier_s:.0f} s ({'fits' if c.fits else 'does not fit'} {SAFETY:.0%} of {budget:.0f} s)")
    fitting = [(c, sized) for c, sized in choices if c.fits]
    return SizingResult(measurements=(small, large, alone), shared_slowdown=round(slowdown, 3),
                        choices=tuple(c for c, _ in choices), chosen=fitting[-1][0] if fitting else None,
                        budget_s=budget, plan=fitting[-1][1] if fitting else None)


def _describe(m: Measurement) -> str:
    steps = ", ".join(f"{r} {s * 1e3:.1f} ms" for r, s in m.step_s.items()) or "no run finished"
    start = f"; start-up up to {max(m.startup_s.values()):.0f} s" if m.startup_s else ""
    return f"measured {m.preset} with {m.at_once} at once: {steps}{start}"


# each line's key (kept), its value (replaced) and its comment (kept)
def sized_plan_text(text: str, preset: str, train_iters: int, eval_interval: int, fixed_on: str) -> str:
    """The plan's text with the chosen size written in (its other lines and comments kept)."""
    values = {"preset": preset, "train_iters": str(train_iters), "eval_interval": str(eval_interval),
              "fixed_on": f'"{fixed_on}"'}
    for key, pattern in SIZED_LINES.items():
        text, count = re.subn(pattern, lambda m, v=values[key]: m.group(1) + v + (m.group(3) or ""), text,
                              count=1, flags=re.MULTILINE)
        if count != 1:
            raise StudyPlanError(f"cannot write the size into the plan: no line for {key} ({pattern})")
    return text


def write_sizing(result: SizingResult, plan_path: Path, out: Path, dry_run: bool,
                 say: Callable[[str], None]) -> StudyPlan | None:
    """Write ``out/sizing.json`` and, when a size was chosen, the plan with it as ``out/plan.yaml`` and
    into ``plan_path`` itself (not for a dry run: a toy model measures nothing of the device). The
    sized plan; None when no candidate fits."""
    (out / "sizing.json").write_text(json.dumps(result.as_json(), indent=1) + "\n")
    if result.chosen is None:
        say("no candidate size fits the time left: nothing trained (a run that cannot finish is no result)")
        return None
    device = result.plan.step_time.measured_device
    text = sized_plan_text(plan_path.read_text(encoding="utf-8"), result.chosen.preset, result.plan.train_iters,
                           result.plan.eval_interval, f"{device}, {datetime.date.today().isoformat()}")
    (out / "plan.yaml").write_text(text, encoding="utf-8")
    if not dry_run:
        plan_path.write_text(text, encoding="utf-8")
    say(f"sized: {result.chosen.preset}, {result.plan.train_iters} iterations, ~{result.chosen.tier_s:.0f} s for all "
        f"{len(result.plan.order)} runs; written into {out / 'plan.yaml'}" + ("" if dry_run else f" and {plan_path}"))
    return result.plan
