"""The study's presentation says what ran: the recipe table names its loss column for what it is (the
mean of the last 10 % of training losses), the forest plot draws the paired validation gap and the
unpaired training-loss gap on two axes, each named, mixed pairs hollow and named in the row, and a
recipe whose definition changed since its runs is shown under the name of what ran (``--label``)."""
import csv
from pathlib import Path

import matplotlib
import pytest

from megatron.quant.analysis.runs import forest, ledger, report

matplotlib.use("Agg")
STUDY = Path(__file__).resolve().parents[3] / "docs" / "study"


def test_the_forest_plot_puts_two_measures_on_two_named_axes():
    with open(STUDY / "tier1_recipes.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert "last-10% loss mean" in rows[0] and "loss mean" not in rows[0] and "mixed pairs" in rows[0]
    job = forest.forest_job(rows, "bf16")
    fig = job.draw(job.payload)
    paired, unpaired = [ax for ax in fig.axes if ax.get_visible()]
    assert paired.get_xlabel() == "paired validation-loss gap to bf16 (%)"
    assert unpaired.get_xlabel() == "last-10 % training-loss gap to bf16 (%)"
    names = [label.get_text() for label in paired.get_yticklabels()]
    assert "te-nvfp4-sr24 (3 seeds, 3 of 3 pairs mixed)" in names and "bf16 (3 seeds)" in names
    assert "final-loss" not in job.caption and "te-nvfp4 " not in " ".join(names)


def test_a_label_shows_a_recipe_under_the_name_of_what_ran():
    runs = ledger.ledger_runs(STUDY / "ledger" / "gpu-tier1-d20")
    shown = report.relabel(runs, report.parse_labels(["te-nvfp4=te-nvfp4-sr24"]))
    names = {run.name for run in shown}
    assert {"te-nvfp4-sr24", "te-nvfp4-sr24-seed2", "te-nvfp4-sr24-seed3"} <= names and "te-nvfp4" not in names
    assert any("ran as recipe te-nvfp4, shown as te-nvfp4-sr24" in run.notes for run in shown)
    with pytest.raises(report.RunsReportError, match="--label: no runs of hifp8"):
        report.relabel(runs, {"hifp8": "x"})
    for bad in ("te-nvfp4", "=x", "a=b=c"):
        with pytest.raises(report.RunsReportError, match="expected RECIPE=NAME"):
            report.parse_labels([bad])


def test_published_gaps_are_anchor_rows_beside_ours(tmp_path):
    anchors = forest.read_anchors(STUDY / "quartet2_anchors.csv")
    assert {a["published"] for a in anchors} >= {"NVIDIA's NVFP4 recipe", "Quartet-II"}
    nvidia = next(a for a in anchors if a["published"] == "NVIDIA's NVFP4 recipe")
    assert nvidia["gap"] == pytest.approx(0.016, abs=5e-4) and nvidia["recipe"] == "te-nvfp4"
    with open(STUDY / "tier1_recipes.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    job = forest.forest_job(rows, "bf16", anchors=anchors)
    paired = job.draw(job.payload).axes[0]
    names = [label.get_text() for label in paired.get_yticklabels()]
    assert "NVIDIA's NVFP4 recipe (30M), published" in names and "grey diamonds: published gaps" in job.caption
    matched = forest.forest_job(rows, "bf16", anchors=[{**anchors[0], "recipe": "mxfp4"}])
    names = [label.get_text() for label in matched.draw(matched.payload).axes[0].get_yticklabels()]
    assert "mxfp4 (3 seeds; grey: published 30M)" in names and len(names) == len(rows)
    bad = tmp_path / "bad.csv"
    bad.write_text("published,recipe,gap,parameters\nX,,not a number,1\n")
    with pytest.raises(ValueError, match="line 2"):
        forest.read_anchors(bad)


def test_the_runs_report_draws_published_anchors_beside_its_forest(tmp_path, capsys):
    from megatron.quant.analysis.runs import metrics

    runs = report.relabel(ledger.ledger_runs(STUDY / "ledger" / "gpu-tier1-d20"), {"te-nvfp4": "te-nvfp4-sr24"})
    groups = metrics.recipe_groups(runs)
    anchors = forest.read_anchors(STUDY / "quartet2_anchors.csv")
    baseline = next(run for run in runs if run.name == "bf16")
    curves = [run for run in runs if run.seed_of is None]
    jobs = report.all_figure_jobs(curves, baseline, 0.6, None, groups, metrics.recipe_table(groups, "bf16"), anchors)
    assert next(job for job in jobs if job.path == forest.NAME).payload["anchors"] == anchors
    bad = tmp_path / "bad.csv"
    bad.write_text("published,recipe,gap,parameters\nX,,1%,1\n")
    argv = ["--ledger", str(STUDY / "ledger" / "gpu-tier1-d20"), "--output_dir", str(tmp_path / "r"), "--anchors"]
    assert report.main([*argv, str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--anchors: " in err and "line 2" in err and len(err.splitlines()) == 1
