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
    assert base["seeds"] == 3 and base["loss mean"] == pytest.approx(end, rel=1e-6)
    assert base["loss std"] == pytest.approx(0.01 * end, rel=1e-4)
    assert base["baseline seed spread"] == pytest.approx(0.02, rel=1e-4)
    assert base["validation loss mean"] == pytest.approx(2.0, rel=1e-6)
    assert base["validation loss std"] == pytest.approx(0.02, rel=1e-4)
    far, near = rows["far"], rows["near"]
    assert far["gap to baseline"] == pytest.approx(0.05, rel=1e-4)
    assert far["gap ±"] == pytest.approx(1.05 * math.hypot(0.01, 0.01), rel=1e-3)
    assert far["beyond noise"] is True and near["beyond noise"] is False
    assert near["gap to baseline"] == pytest.approx(0.005, rel=1e-3)
    assert (near["seeds"], near["incomplete"], near["diverged"]) == (4, 1, 0)
    assert near["loss std"] == pytest.approx(0.01 * 1.005 * end, rel=1e-3)  # over the three complete seeds
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
