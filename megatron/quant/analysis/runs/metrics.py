"""The numbers of the runs comparison: relative gaps to the baseline, smoothing, spikes, the per-run
summary row, the baseline's noise band, recipes over seeds (groups, table, band payload).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from megatron.quant.analysis.runs import seed_stats
from megatron.quant.analysis.runs.ledger import DIRTY, recipe_lines
from megatron.quant.analysis.runs.read import GRAD_NORM, LOSS, TOKENS_PER_S, VALIDATION, Run, Series, first_not_finite

GAP_THRESHOLDS = (0.01, 0.05)
LAST_SHARE = 0.1          # "the last 10 %" of the common iterations
SPIKE_FACTOR, SPIKE_WINDOW = 4.0, 50  # a grad-norm spike: above 4x the median of the previous 50


# ---- numbers --------------------------------------------------------------------------------
def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: exponential moving average with the startup bias removed."""
    out = np.empty(len(values))
    average, norm = 0.0, 0.0
    for i, value in enumerate(values):
        average = average * weight + (1 - weight) * value
        norm = norm * weight + (1 - weight)
        out[i] = average / norm if norm else value
    return out


def relative_gap(run: Series, baseline: Series, smoothing: float = 0.0) -> Series:
    """``run / baseline - 1`` at the iterations both logged, of the (smoothed) curves."""
    common, i, j = np.intersect1d(run[0], baseline[0], return_indices=True)
    return common, smooth(run[1], smoothing)[i] / smooth(baseline[1], smoothing)[j] - 1.0


def first_above(gap: Series, threshold: float) -> Optional[int]:
    above = np.flatnonzero(gap[1] > threshold)
    return int(gap[0][above[0]]) if above.size else None


def last_share_mean(values: np.ndarray, share: float = LAST_SHARE) -> float:
    if not values.size:
        return math.nan
    return float(values[-max(1, math.ceil(share * values.size)):].mean())


def grad_norm_spikes(values: np.ndarray, factor: float = SPIKE_FACTOR, window: int = SPIKE_WINDOW) -> int:
    """Iterations whose grad norm exceeds ``factor`` x the median of the previous ``window`` (>= 5 of them)."""
    return sum(1 for i in range(5, len(values))
               if values[i] > factor * np.median(values[max(0, i - window):i]))


def loss_notes(run: Run, baseline: Run) -> list[str]:
    """Why gaps are blank from some iteration on: the run's or the baseline's loss is not finite."""
    notes = []
    for who, source in (("loss", run), (f"baseline {baseline.name}'s loss", baseline)):
        step = first_not_finite(source.series(LOSS))
        if step is not None and (source is run or run is not baseline):
            notes.append(f"{who} not finite from iteration {step}: gaps blank from there")
    return notes


def length_notes(run: Run, baseline: Run) -> list[str]:
    """What the gaps could not cover: no loss logged, or runs of different lengths (the gaps end
    where the shorter one does)."""
    steps, base = run.series(LOSS)[0], baseline.series(LOSS)[0]
    if not steps.size:
        return [f"no {LOSS} logged: nothing to compare"]
    if run is baseline or not base.size or steps[-1] == base[-1]:
        return []
    if steps[-1] > base[-1]:
        return [f"compared up to iteration {int(base[-1])}, where the baseline {baseline.name} stops "
                f"(this run: {int(steps[-1])})"]
    return [f"stops at iteration {int(steps[-1])}, the baseline {baseline.name} at {int(base[-1])}"]


def _median(series: Series) -> float:
    return float(np.median(series[1])) if series[1].size else math.nan


def summarize(run: Run, baseline: Run, smoothing: float) -> dict:
    """The table/CSV row of ``run`` against ``baseline``."""
    loss = run.series(LOSS)
    raw_gap = relative_gap(loss, baseline.series(LOSS))
    gap = relative_gap(loss, baseline.series(LOSS), smoothing)
    validation = run.series(VALIDATION)
    row = {
        "run": run.name, "recipe": run.record.get("recipe", run.seed_of or run.name),
        "status": run.record.get("status", "diverged" if run.diverged else "unknown"),
        "diverged": run.diverged,
        "iterations": int(loss[0][-1]) if loss[0].size else 0,
        "final loss": float(loss[1][-1]) if loss[1].size else math.nan,
        "gap at end": float(gap[1][-1]) if gap[1].size else math.nan,
        "gap last 10%": last_share_mean(raw_gap[1]),
    }
    for threshold in GAP_THRESHOLDS:
        row[f"first iteration gap > {threshold:.0%}"] = first_above(gap, threshold)
    row["grad-norm spikes"] = grad_norm_spikes(run.series(GRAD_NORM)[1])
    row["tokens/s"] = _median(run.series(TOKENS_PER_S))
    row["tokens/s vs baseline"] = row["tokens/s"] / _median(baseline.series(TOKENS_PER_S))
    row["final validation loss"] = float(validation[1][-1]) if validation[1].size else math.nan
    commit, clean = code_of(run)
    row["commit"] = (commit or "")[:12]
    row["tree"] = {True: "clean", False: "uncommitted changes", None: ""}[clean] + (
        " (allowed)" if run.record.get("dirty_allowed") else "")
    row["notes"] = "; ".join(run.notes + length_notes(run, baseline) + loss_notes(run, baseline))
    return row


def noise_band(baseline: Run, seeds: Sequence[Run], smoothing: float) -> Optional[tuple[np.ndarray, ...]]:
    """(iterations, low, high): the spread of the baseline's seed runs' gaps to it (0 included);
    None without seed runs."""
    gaps = [relative_gap(seed.series(LOSS), baseline.series(LOSS), smoothing) for seed in seeds]
    if not gaps:
        return None
    common = gaps[0][0]
    for steps, _ in gaps[1:]:
        common = np.intersect1d(common, steps)
    stacked = np.stack([values[np.isin(steps, common)] for steps, values in gaps] + [np.zeros(common.size)])
    return common, stacked.min(0), stacked.max(0)


def recipe_groups(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Recipe -> its runs (``NAME`` and ``NAME-seed<N>``), in the order of ``runs``."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.seed_of or run.name, []).append(run)
    return groups


def last_iteration(runs: Sequence[Run]) -> int:
    """The last training iteration any of ``runs`` logged (-1 for none)."""
    return max((int(run.series(LOSS)[0][-1]) for run in runs if run.series(LOSS)[0].size), default=-1)


def _complete(run: Run, end: int) -> bool:
    """Trained to its end: ``finished`` in its run.json (the sweep checked ``--train-iters``; a run killed
    midway stays ``running``, ``interrupted`` or ``crashed``); without a status, as far as ``end``."""
    if "status" in run.record:
        return run.record["status"] == "finished"
    return bool(run.series(LOSS)[0].size) and run.series(LOSS)[0][-1] >= end


def code_of(run: Run) -> tuple[Optional[str], Optional[bool]]:
    """(the commit the run's code came from, without its "+dirty" suffix; whether its tree was clean),
    from its record (a ledger entry's, or run.json's); None where unknown."""
    commit = run.record.get("git_commit")
    if not isinstance(commit, str) or not commit:
        return None, None
    clean = run.record.get("tree_clean", not commit.endswith(DIRTY))
    return commit.removesuffix(DIRTY), clean if isinstance(clean, bool) else None


def _seed_runs(runs: Sequence[Run], end: int) -> list[seed_stats.SeedRun]:
    """Runs not trained to their end (still running, interrupted, or logging no loss) are incomplete."""
    return [seed_stats.SeedRun(run.series(LOSS), run.series(VALIDATION), run.diverged,
                               _complete(run, end) and bool(run.series(LOSS)[0].size), run.seed_slot,
                               *code_of(run), tuple(recipe_lines(run.record.get("recipe_resolved") or [])))
            for run in runs]


def recipe_table(groups: dict[str, list[Run]], baseline: str) -> list[dict]:
    """One ``seed_stats.recipe_row`` per recipe, the baseline first; a run is complete when it got
    as far as the furthest run of the study."""
    end = last_iteration([run for runs in groups.values() for run in runs])
    return [seed_stats.recipe_row(name, _seed_runs(runs, end), _seed_runs(groups[baseline], end))
            for name, runs in sorted(groups.items(), key=lambda item: item[0] != baseline)]


def band_payload(groups: dict[str, list[Run]], baseline: str, smoothing: float) -> dict:
    """Per recipe: (iterations, mean, min, max) of its seeds' smoothed losses, and of their gaps to
    the baseline's mean curve (complete runs only: a band stops where its shortest curve does)."""
    end = last_iteration([run for runs in groups.values() for run in runs])

    def curves(runs: Sequence[Run]) -> list[Series]:
        return [(run.series(LOSS)[0], smooth(run.series(LOSS)[1], smoothing)) for run, seed_run
                in zip(runs, _seed_runs(runs, end)) if seed_run.usable]

    base = seed_stats.band(curves(groups[baseline]))
    loss, gaps = {}, {}
    for name, runs in groups.items():
        own = curves(runs)
        mine = seed_stats.band(own)
        if mine is None or base is None:
            continue
        loss[name] = [values.tolist() for values in mine] + [len(own)]
        relative = [relative_gap(curve, (base[0], base[1])) for curve in own]
        gaps[name] = [values.tolist() for values in seed_stats.band(relative)]
    return {"loss": loss, "gap": gaps, "baseline": baseline, "smoothing": smoothing}
