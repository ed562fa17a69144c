"""The run report over seeds: recipe bands and the recipe table's uncertainty, on synthetic
TensorBoard event files whose seed spread is known."""
import csv
import math

import numpy as np
import pytest
from test_runs_report import _write

from megatron.quant.analysis.runs import html as runs_html
from megatron.quant.analysis.runs import metrics, read, seed_stats
from megatron.quant.analysis.runs import report as runs_report

STEPS = np.arange(1, 101)
BASE = 2 + 4 * np.exp(-STEPS / 30)
SEEDS = {"": 1.0, "-seed1": 1.01, "-seed2": 0.99}  # run suffix -> factor: mean 1, std 0.01, range 0.02


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    for recipe, level in (("bf16", 1.0), ("far", 1.05), ("near", 1.005)):
        for suffix, factor in SEEDS.items():
            _write(root / f"{recipe}{suffix}", {"train/lm loss": level * factor * BASE,
                                               "validation/lm loss": {50: 3.0 * level * factor,
                                                                      100: 2.0 * level * factor}})
    _write(root / "shaky", {"train/lm loss": 1.02 * BASE})
    _write(root / "shaky-seed1", {"train/lm loss": BASE[:20], "train/diverged": {21: 1.0}}, steps=STEPS[:20])
    _write(root / "single", {"train/lm loss": 1.1 * BASE})
    # A seed run still training (or interrupted) at iteration 40: its loss is not final.
    _write(root / "near-seed3", {"train/lm loss": 1.005 * BASE[:40]}, steps=STEPS[:40])
    out = tmp_path_factory.mktemp("report")
    return root, out, runs_report.write_runs_report(root, out, "bf16", smoothing=0.0)


def test_recipe_table_gives_mean_gap_uncertainty_and_noise_verdict(seeded):
    _, out, report = seeded
    rows = {row["recipe"]: row for row in report.recipes}
    assert list(rows) == ["bf16", "far", "near", "shaky", "single"]  # the baseline first
    end = seed_stats.endpoint(BASE)
    base = rows["bf16"]
    assert base["seeds"] == 3 and base["last-10% loss mean"] == pytest.approx(end, rel=1e-6)
    assert base["last-10% loss std"] == pytest.approx(0.01 * end, rel=1e-4)
    assert base["baseline seed spread"] == pytest.approx(0.02, rel=1e-4)
    assert base["validation loss mean"] == pytest.approx(2.0, rel=1e-6)
    assert base["validation loss std"] == pytest.approx(0.02, rel=1e-4)
    far, near = rows["far"], rows["near"]
    assert far["gap to baseline"] == pytest.approx(0.05, rel=1e-4)
    assert far["gap ±"] == pytest.approx(1.05 * math.hypot(0.01, 0.01), rel=1e-3)
    assert far["beyond noise"] is True and near["beyond noise"] is False
    assert near["gap to baseline"] == pytest.approx(0.005, rel=1e-3)
    assert (near["seeds"], near["incomplete"], near["diverged"]) == (4, 1, 0)
    assert near["last-10% loss std"] == pytest.approx(0.01 * 1.005 * end, rel=1e-3)  # over the three complete seeds
    assert rows["shaky"]["seeds"] == 2 and rows["shaky"]["diverged"] == 1
    assert rows["shaky"]["gap to baseline"] == pytest.approx(0.02, rel=1e-4)
    assert math.isnan(rows["single"]["gap ±"]) and rows["single"]["beyond noise"] is True  # 10 % > 2 % spread
    with open(out / runs_html.RECIPES_CSV) as handle:
        table = list(csv.DictReader(handle))
    assert [row["recipe"] for row in table] == list(rows) and float(table[1]["gap to baseline"]) == pytest.approx(0.05,
                                                                                                              rel=1e-4)
    page = (out / "index.html").read_text()
    assert "Recipes over seeds" in page and "+5.00 %" in page and (out / "loss_bands.png").is_file()


def test_bands_span_the_seeds_and_leave_diverged_runs_out(seeded):
    root = seeded[0]
    groups = metrics.recipe_groups(read.load_runs(root))
    payload = metrics.band_payload(groups, "bf16", 0.0)
    steps, mean, low, high, count = payload["loss"]["far"]
    assert count == 3 and steps == STEPS.tolist()
    assert np.allclose(mean, 1.05 * BASE) and np.allclose(low, 1.05 * 0.99 * BASE)
    assert np.allclose(high, 1.05 * 1.01 * BASE)
    _, gap, gap_low, gap_high = payload["gap"]["far"]
    assert np.allclose(gap, 0.05) and np.allclose(gap_low, 1.05 * 0.99 - 1) and np.allclose(gap_high, 1.05 * 1.01 - 1)
    assert payload["loss"]["shaky"][-1] == 1  # the diverged seed is left out of the band
    steps, *_, count = payload["loss"]["near"]
    assert count == 3 and steps == STEPS.tolist()  # the incomplete seed neither counts nor cuts the band short


def test_without_seed_runs_there_is_no_recipe_table(tmp_path):
    _write(tmp_path / "bf16", {"train/lm loss": BASE})
    _write(tmp_path / "mxfp4", {"train/lm loss": 1.01 * BASE})
    report = runs_report.write_runs_report(tmp_path, tmp_path / "report", "bf16")
    assert report.recipes == [] and not (tmp_path / "report" / runs_html.RECIPES_CSV).exists()


def test_a_dozen_recipes_get_distinct_colours_and_a_legend_wide_enough():
    """The study draws 12 recipes: ten default colours would repeat, and long names such as
    'te-nvfp4+bf16-layers (3 seeds)' overflowed a fixed-width legend."""
    from matplotlib.colors import to_rgba

    from megatron.quant.analysis import figures

    colors = [to_rgba(c) for c in figures.series_colors(12)]
    assert len(set(colors)) == 12
    assert figures.series_colors(3) == ["C0", "C1", "C2"]
    assert figures.legend_width(["bf16"]) == 1.6
    assert figures.legend_width(["te-nvfp4+bf16-layers (3 seeds)"]) > 2.5


def test_paired_gaps_cancel_what_the_seed_moves(seeded):
    """Each recipe's seeds move exactly as bf16's do: paired with the bf16 run of the same seed, the
    0.5 % gap of 'near' stands out, where unpaired it hides in bf16's 2 % seed spread."""
    rows = {row["recipe"]: row for row in seeded[2].recipes}
    near, far = rows["near"], rows["far"]
    assert near["beyond noise"] is False and near["beyond noise, paired"] is True
    assert near["paired pairs"] == 3 and near["paired gap"] == pytest.approx(0.005, rel=1e-5)  # seed3 incomplete
    assert near["paired gap std"] == pytest.approx(0.0, abs=1e-6) and far["paired gap"] == pytest.approx(0.05, rel=1e-5)
    assert rows["bf16"]["paired gap"] == 0.0 and rows["bf16"]["beyond noise, paired"] is False
    assert rows["single"]["paired pairs"] == 0 and rows["single"]["beyond noise, paired"] is None  # no validation


def _run(pair, *validations):
    series = (np.arange(1, len(validations) + 1), np.asarray(validations, dtype=float))
    return seed_stats.SeedRun(loss=series, validation=series, pair=pair)


def test_a_paired_interval_by_hand():
    """Gaps 1 %, 2 %, 3 % over three pairs (the last three validations averaged, an earlier one left
    out): mean 2 %, std 1 %, 95 % half-width t(0.975, 2) = 4.3027 x 1 % / sqrt(3) = 2.484 %: not beyond 0."""
    baseline = [_run("", 9.0, 1.0, 1.0, 1.0), _run("1", 2.0, 2.0, 2.0), _run("2", 4.0, 4.0, 4.0)]
    runs = [_run("", 5.0, 1.01, 1.01, 1.01), _run("1", 2.04, 2.04, 2.04), _run("2", 4.12, 4.12, 4.12),
            _run("7", 1.0, 1.0, 1.0)]  # no twin: left out
    gap = seed_stats.paired_gap(runs, baseline)
    assert gap.n == 3 and gap.mean == pytest.approx(0.02) and gap.std == pytest.approx(0.01)
    assert gap.half_width == pytest.approx(4.302652729911275 * 0.01 / math.sqrt(3))
    assert gap.beyond_noise is False
    tighter = seed_stats.paired_gap([_run("", 1.02), _run("1", 2.04), _run("2", 4.08)], baseline)
    assert tighter.std == pytest.approx(0.0, abs=1e-12) and tighter.beyond_noise is True
