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
