"""A recipe over seeds: its loss curves as a mean with a min-max band, and its gap to the baseline
with an uncertainty (the numbers behind the run report's recipe table and band figure).

Each seed run's loss is the mean of its last 10 % of logged training losses (one iteration's
loss is noisier than the seeds' spread); its validation loss is the last one logged. Over a
recipe's seeds: the mean, the sample standard deviation and the min/max. The gap is
``mean_recipe / mean_baseline - 1``; its ``±`` is one standard deviation combined from both
recipes' seed standard deviations (how far one pair of runs may move with the seed, not the
standard error of the means). The gap is *beyond noise* when it exceeds the baseline's own seed
spread ((max - min) / mean over the baseline's seeds); with fewer than two baseline seeds that is
unknown.

Paired gaps: a recipe's run and its baseline twin share the seed, hence the initialisation and the
data order (``SeedRun.pair``: the sweep's seed slot), so most of what the seed moves cancels in
their difference. Per pair, the gap of the validation loss averaged over the last
``PAIRED_EVALUATIONS`` evaluations; over the pairs, its mean and a 95 % Student-t interval
(mean ± t(0.975, n - 1) · std / √n). The gap is *beyond noise, paired* when that interval leaves 0.

A pair answers for one recipe only when both runs ran the same code: one commit, from a tree without
uncommitted changes, and the recipe resolved as in its other seeds. A pair that is not (``mixed``)
still counts, and the row says how many pairs are mixed and why (``mixed pairs``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import stats as scipy_stats

Series = tuple[np.ndarray, np.ndarray]  # (iterations, values)
LAST_SHARE = 0.1
PAIRED_EVALUATIONS = 3  # validations averaged per run for a paired gap


@dataclass(frozen=True)
class SeedRun:
    loss: Series
    validation: Series
    diverged: bool = False
    complete: bool = True  # trained as far as the study's runs do (not still running, not stopped early)
    pair: str = ""  # the seed slot a recipe's run shares with its baseline twin ("" the first seed, else N)
    commit: Optional[str] = None  # the code that ran (without a "+dirty" suffix); None: unknown
    clean: Optional[bool] = None  # False: the tree had uncommitted changes
    definition: tuple[str, ...] = ()  # the recipe as resolved (normalised lines); (): unknown

    @property
    def usable(self) -> bool:
        """Its final loss means something: finished, and not diverged."""
        return self.complete and not self.diverged


@dataclass(frozen=True)
class Spread:
    n: int
    mean: float
    std: float   # sample standard deviation; nan below two values
    low: float
    high: float

    @property
    def relative_range(self) -> float:
        """(max - min) / mean; nan below two values."""
        return (self.high - self.low) / self.mean if self.n > 1 and self.mean else math.nan


def endpoint(values: np.ndarray, share: float = LAST_SHARE) -> float:
    """The mean of the last ``share`` of ``values`` (at least one); nan when empty."""
    if not values.size:
        return math.nan
    return float(values[-max(1, math.ceil(share * values.size)):].mean())


def spread(values: Sequence[float]) -> Spread:
    """Mean, sample std, min and max of the finite ``values``."""
    finite = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if not finite.size:
        return Spread(0, math.nan, math.nan, math.nan, math.nan)
    std = float(finite.std(ddof=1)) if finite.size > 1 else math.nan
    return Spread(int(finite.size), float(finite.mean()), std, float(finite.min()), float(finite.max()))


def gap(recipe: Spread, baseline: Spread) -> tuple[float, float]:
    """(relative gap of the means, its one-std uncertainty from both recipes' seed spreads)."""
    ratio = recipe.mean / baseline.mean
    return ratio - 1.0, ratio * math.hypot(recipe.std / recipe.mean, baseline.std / baseline.mean)


@dataclass(frozen=True)
class PairedGap:
    n: int           # seed pairs
    mean: float      # mean over the pairs of (recipe / twin - 1)
    std: float       # their sample standard deviation; nan below two pairs
    half_width: float  # of the 95 % Student-t interval of the mean; nan below two pairs

    @property
    def beyond_noise(self) -> Optional[bool]:
        """The interval leaves 0; None below two pairs."""
        return None if not math.isfinite(self.half_width) else abs(self.mean) > self.half_width


def paired_gap(runs: Sequence[SeedRun], baseline: Sequence[SeedRun]) -> PairedGap:
    """The gap of each usable run to its usable baseline twin (same ``pair``) on the validation loss
    averaged over the last ``PAIRED_EVALUATIONS`` evaluations, over the pairs."""
    twins = {run.pair: run for run in baseline if run.usable and run.validation[1].size}
    gaps = [_last_validations(run) / _last_validations(twins[run.pair]) - 1.0 for run in runs
            if run.usable and run.validation[1].size and run.pair in twins]
    found = spread(gaps)
    if found.n < 2:
        return PairedGap(found.n, found.mean, math.nan, math.nan)
    t = float(scipy_stats.t.ppf(0.975, found.n - 1))
    return PairedGap(found.n, found.mean, found.std, t * found.std / math.sqrt(found.n))


def mixed_pairs(runs: Sequence[SeedRun], baseline: Sequence[SeedRun]) -> list[str]:
    """Why each of the pairs of ``paired_gap`` does not answer for one code and one recipe
    definition: one line per mixed pair, in pair order."""
    twins = {run.pair: run for run in baseline if run.usable and run.validation[1].size}
    paired = [(run, twins[run.pair]) for run in runs if run.usable and run.validation[1].size and run.pair in twins]
    first = next((run.definition for run in runs if run.definition), ())
    found = []
    for run, twin in paired:
        why = [f"commits {run.commit[:7]} and {twin.commit[:7]}" for _ in [0]
               if run.commit and twin.commit and run.commit != twin.commit]
        if run.clean is False or twin.clean is False:
            why.append("uncommitted changes")
        if run.definition and first and run.definition != first:
            why.append("another recipe definition")
        if why:
            found.append(f"seed {run.pair or 'first'}: {', '.join(why)}")
    return found


def _last_validations(run: SeedRun) -> float:
    return float(run.validation[1][-PAIRED_EVALUATIONS:].mean())


def recipe_row(recipe: str, runs: Sequence[SeedRun], baseline: Sequence[SeedRun]) -> dict:
    """The recipe table's row: loss and validation loss over seeds, gap to the baseline and whether
    it is beyond the baseline's seed spread. Diverged and incomplete runs are counted, not averaged
    (a run still training has a higher loss than it will end with)."""
    finished, notes = [run for run in runs if run.usable], []
    ends, base_ends = _ends(finished), _ends([run for run in baseline if run.usable])
    if len(ends) > 1:  # means over seeds of different lengths would mix earlier and later losses
        notes.append(f"finished runs end at iterations {', '.join(map(str, ends))}: not averaged")
        finished = []
    loss = spread([endpoint(run.loss[1]) for run in finished])
    base = spread([endpoint(run.loss[1]) for run in baseline if run.usable] if len(base_ends) == 1 else [])
    validation = spread([float(run.validation[1][-1]) for run in finished if run.validation[1].size])
    relative, uncertainty = gap(loss, base) if loss.n and base.n else (math.nan, math.nan)
    if loss.n and base.n and ends != base_ends:
        notes.append(f"ends at iteration {ends[0]}, the baseline at {base_ends[0]}: no gap")
        relative, uncertainty = math.nan, math.nan
    if any(not run.loss[0].size for run in runs):
        notes.append(f"{sum(not run.loss[0].size for run in runs)} run(s) logged no training loss")
    noise = base.relative_range
    paired = paired_gap(finished, [run for run in baseline if run.usable] if len(base_ends) == 1 else [])
    mixed = mixed_pairs(finished, [run for run in baseline if run.usable] if len(base_ends) == 1 else [])
    if math.isnan(relative):
        paired, mixed = PairedGap(0, math.nan, math.nan, math.nan), []
    if mixed:
        notes.append(f"{len(mixed)} of {paired.n} pairs mixed ({'; '.join(mixed)})")
    return {"recipe": recipe, "seeds": len(runs), "diverged": sum(run.diverged for run in runs),
            "incomplete": sum(not run.complete and not run.diverged for run in runs),
            "last-10% loss mean": loss.mean, "last-10% loss std": loss.std, "gap to baseline": relative,
            "gap ±": uncertainty,
            "baseline seed spread": noise,
            "beyond noise": None if math.isnan(noise) or math.isnan(relative) else bool(abs(relative) > noise),
            "paired pairs": paired.n, "mixed pairs": len(mixed), "paired gap": paired.mean,
            "paired gap std": paired.std,
            "paired 95% ±": paired.half_width, "beyond noise, paired": paired.beyond_noise,
            "validation loss mean": validation.mean, "validation loss std": validation.std, "notes": "; ".join(notes)}


def _ends(runs: Sequence[SeedRun]) -> list[int]:
    """The distinct last iterations of ``runs``' losses, sorted."""
    return sorted({int(run.loss[0][-1]) for run in runs})


def band(curves: Sequence[Series]) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(iterations, mean, min, max) over ``curves`` at the iterations all of them logged; None without any."""
    if not curves:
        return None
    common = curves[0][0]
    for steps, _ in curves[1:]:
        common = np.intersect1d(common, steps)
    stacked = np.stack([values[np.isin(steps, common)] for steps, values in curves])
    return common, stacked.mean(0), stacked.min(0), stacked.max(0)
