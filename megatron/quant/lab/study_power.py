"""Power before runs: from a ledger's paired spread, the 95 % interval a recipe's paired gap will have
with a given number of seeds, the seeds a target interval needs, and whether the evaluation set's
own noise is below the seed noise (and how many held-out tokens make it so).

A recipe's **paired spread** is the sample standard deviation, over the seeds, of its runs' paired
gaps (the run's validation loss, averaged over its last ``PAIRED_EVALUATIONS`` evaluations, against
the baseline run of the same seed: ``analysis.runs.seed_stats``). With n seeds the gap's 95 % interval
is ± t(0.975, n - 1) · spread / √n.

The **evaluation noise** is how far a pair's gap would move on another draw of as many held-out
tokens. Both runs of a pair are evaluated on the same tokens, so what matters is the noise of their
*difference*, far below a loss's own. The ledger keeps no per-token losses; it keeps the training
loss, whose iterations each see a fresh batch, the same batch for both runs of a pair (same seed,
same data order). So the pair's per-iteration training-loss gap, around its trend (a running median
of ``TREND_WINDOW`` logs) over the run's second half, measures that noise for one batch's tokens
(an upper bound: it also holds the runs' step-to-step jitter); it scales to the held-out set's tokens
as 1 / √tokens. The held-out set is large enough when it is at most ``EVAL_SHARE`` of the paired
spread (a third: it then adds at most a tenth to the pairs' variance).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as scipy_stats

from megatron.quant.analysis.runs.ledger import LedgerEntry
from megatron.quant.analysis.runs.read import LOSS, VALIDATION
from megatron.quant.analysis.runs.seed_stats import PAIRED_EVALUATIONS
from megatron.quant.lab import sweep
from megatron.quant.lab.study_plan import StudyPlan

BASELINE = "bf16"
TREND_WINDOW = 9  # logged losses in the running median a log's noise is measured against
EVAL_SHARE = 1 / 3  # of the paired spread: the most the evaluation noise may be
MAX_SEEDS = 64  # a target needing more is out of reach


@dataclass(frozen=True)
class Spread:
    recipe: str
    pairs: int
    std: float  # of the per-seed paired gaps (relative)


def half_width(std: float, seeds: int) -> float:
    """The paired gap's 95 % Student-t half-width with ``seeds`` pairs of spread ``std``; inf below two."""
    if seeds < 2:
        return math.inf
    return float(scipy_stats.t.ppf(0.975, seeds - 1)) * std / math.sqrt(seeds)


def seeds_for(std: float, target: float) -> int | None:
    """The fewest seeds (2 or more) whose interval is at most ``target``; None beyond ``MAX_SEEDS``."""
    return next((n for n in range(2, MAX_SEEDS + 1) if half_width(std, n) <= target), None)


def _usable(entries: Sequence[LedgerEntry], study: str) -> list[LedgerEntry]:
    return [e for e in entries if e.study == study and not e.dry_run and e.status == sweep.FINISHED
            and len(e.scalars.get(VALIDATION, ([], []))[1]) >= 1]


def _validation(entry: LedgerEntry) -> float:
    return float(np.nanmean(entry.scalars[VALIDATION][1][-PAIRED_EVALUATIONS:]))


def paired_spreads(entries: Sequence[LedgerEntry], study: str) -> list[Spread]:
    """Each recipe's paired spread over the seeds it shares with the baseline (two pairs or more)."""
    by_seed = {e.seed: e for e in _usable(entries, study) if e.recipe == BASELINE}
    gaps: dict[str, list[float]] = defaultdict(list)
    for entry in _usable(entries, study):
        if entry.recipe != BASELINE and entry.seed in by_seed:
            gaps[entry.recipe].append(_validation(entry) / _validation(by_seed[entry.seed]) - 1.0)
    return [Spread(recipe, len(found), statistics.stdev(found)) for recipe, found in sorted(gaps.items())
            if len(found) >= 2]


def evaluation_noise(entries: Sequence[LedgerEntry], study: str) -> tuple[float, int] | None:
    """(a pair's per-iteration training-loss gap's noise around its trend, relative; the tokens of
    the batch it was measured on): the median over the study's pairs; None without pairs that logged
    enough."""
    usable = _usable(entries, study)
    twins = {e.seed: e for e in usable if e.recipe == BASELINE}
    found, tokens = [], 0
    for entry in usable:
        twin = twins.get(entry.seed)
        if entry.recipe == BASELINE or twin is None:
            continue
        (steps, values), (base_steps, base_values) = entry.scalars.get(LOSS, ([], [])), twin.scalars.get(LOSS, ([], []))
        common, i, j = np.intersect1d(steps, base_steps, return_indices=True)
        gap = np.asarray(values, dtype=float)[i] / np.asarray(base_values, dtype=float)[j] - 1.0
        gap = gap[gap.size // 2:]
        gap = gap[np.isfinite(gap)]
        if gap.size < 2 * TREND_WINDOW:
            continue
        trend = np.array([np.median(gap[max(0, k - TREND_WINDOW // 2):k + TREND_WINDOW // 2 + 1])
                          for k in range(gap.size)])
        found.append(float(np.std(gap - trend, ddof=1)))
        tokens = entry.tokens // max(1, entry.iterations)  # one iteration's batch
    return (statistics.median(found), tokens) if found else None


def gap_noise(noise: tuple[float, int], tokens: int) -> float:
    """A pair's gap's noise from the evaluation set alone, for ``tokens`` held-out tokens."""
    relative, measured_on = noise
    return relative * math.sqrt(measured_on / tokens)


def tokens_for(noise: tuple[float, int], std: float) -> int:
    """Held-out tokens that keep ``gap_noise`` at ``EVAL_SHARE`` of a paired spread ``std``."""
    relative, measured_on = noise
    return math.ceil(measured_on * (relative / (EVAL_SHARE * std)) ** 2)


def describe_power(plan: StudyPlan, entries: Sequence[LedgerEntry]) -> str:
    """What the ledger's paired spread (of ``plan.power_from`` or the plan's study) says of the plan's
    intervals: per recipe the 95 % half-width with the plan's seeds (and the seeds its
    ``target_interval`` needs), and the evaluation set's noise against the seed noise."""
    study = plan.power_from or plan.name
    spreads = paired_spreads(entries, study)
    if not spreads:
        return f"power: the ledger holds no paired runs of study {study} yet: no interval to expect"
    eval_tokens = plan.eval_iters * plan.tokens_per_iteration
    lines = [f"power (paired spread of study {study}; {len(plan.seeds)} seeds, {eval_tokens:,} held-out tokens):"]
    for spread in spreads:
        line = (f"  {spread.recipe:<18} spread {100 * spread.std:.2f} % over {spread.pairs} pairs: "
                f"± {100 * half_width(spread.std, len(plan.seeds)):.2f} % (95 %)")
        if plan.target_interval is not None:
            needed = seeds_for(spread.std, plan.target_interval)
            line += (f"; ± {100 * plan.target_interval:.2f} % needs "
                     + (f"{needed} seeds" if needed else f"more than {MAX_SEEDS} seeds"))
        lines.append(line)
    noise = evaluation_noise(entries, study)
    if noise is not None:
        smallest = min(spread.std for spread in spreads)
        lines.append(f"  evaluation noise of a pair's gap ({eval_tokens:,} tokens, an upper bound): "
                     f"{100 * gap_noise(noise, eval_tokens):.3f} %, "
                     f"{'below' if gap_noise(noise, eval_tokens) <= EVAL_SHARE * smallest else 'NOT below'} a third "
                     f"of the smallest seed spread ({100 * smallest:.2f} %); {tokens_for(noise, smallest):,} held-out "
                     "tokens would make it so")
    return "\n".join(lines)


def seeds_needed(plan: StudyPlan, entries: Sequence[LedgerEntry]) -> int | None:
    """The seeds the plan's ``target_interval`` needs for its widest recipe; None without a target, a
    measured spread, or when beyond ``MAX_SEEDS``."""
    spreads = paired_spreads(entries, plan.power_from or plan.name)
    if plan.target_interval is None or not spreads:
        return None
    needed = [seeds_for(spread.std, plan.target_interval) for spread in spreads if spread.recipe in plan.recipes]
    return None if not needed or None in needed else max(needed)


def for_target(plan: StudyPlan, entries: Sequence[LedgerEntry]) -> tuple[StudyPlan, str]:
    """``plan`` with as many of its seeds (its list is the pool, in order) as its ``target_interval``
    needs, and a line saying so; the plan as it is without a target."""
    if plan.target_interval is None:
        return plan, ""
    needed = seeds_needed(plan, entries)
    if needed is None:
        return plan, (f"target ± {100 * plan.target_interval:.2f} %: no measured paired spread reaches it within the "
                      f"ledger's figures (study {plan.power_from or plan.name}); all {len(plan.seeds)} seeds planned")
    kept = plan.seeds[:max(needed, 2)]
    if len(kept) < needed:
        return plan, (f"target ± {100 * plan.target_interval:.2f} %: needs {needed} seeds, the plan lists "
                      f"{len(plan.seeds)}; all of them planned (add seeds to reach the target)")
    trimmed = dataclasses.replace(plan, seeds=tuple(kept), order=tuple(run for run in plan.order if run.seed in kept))
    return trimmed, f"target ± {100 * plan.target_interval:.2f} %: {len(kept)} seeds ({', '.join(map(str, kept))})"
