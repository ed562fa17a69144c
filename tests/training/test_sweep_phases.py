"""A sweep over scheduled recipes names each phase, with its iterations, in the run's run.json; a
plan whose text lacks a line the sizing writes into is refused at load, not after measuring."""
import json
from pathlib import Path

import pytest

from megatron.quant.lab import sweep
from megatron.quant.lab.study_plan import StudyPlanError, load_plan
from tests.training.test_sweep import FLAGS, fake_launcher  # noqa: F401  (the stand-in trainer)

TIER1 = Path(__file__).resolve().parents[2] / "docs" / "study" / "first-tier.yaml"


def test_a_scheduled_recipe_names_its_phases_in_its_run_record(tmp_path, fake_launcher):  # noqa: F811
    recipe = tmp_path / "tail.yaml"
    recipe.write_text("format: te-nvfp4\nschedule:\n  - {from: 0.5, forward: bf16}\n"
                      "  - {from: 1, until: 2, backward: mxfp8}\nevaluation: bf16\n")
    out = tmp_path / "sweep"
    assert sweep.main(["--launcher", fake_launcher, str(out), f"bf16 {recipe}", "--", *FLAGS]) == 0
    record = json.loads((out / "tail" / "run.json").read_text())
    assert record["phases"] == ["phase 1: from 0.5: forward bf16 (iterations 3-4)",
                                "phase 2: from 1 until 2: backward mxfp8 (iterations 1-1)", "evaluation: bf16"]
    assert "phases" not in json.loads((out / "bf16" / "run.json").read_text())


FIXED = '  fixed_on: "NVIDIA H200, 2026-11-27"'


@pytest.mark.parametrize("key, before, after", [
    ("fixed_on", FIXED, ""),  # no line (its comment stays): the plan reads as not yet sized
    ("train_iters", "train_iters: 521", "train_iters:\n  521"),  # the value on a line of its own
])
def test_a_plan_to_size_without_the_lines_the_sizing_writes_is_refused_at_load(tmp_path, key, before, after):
    text = TIER1.read_text().replace(FIXED, "  fixed_on: null") if key != "fixed_on" else TIER1.read_text()
    assert before in text
    plan = tmp_path / "plan.yaml"
    plan.write_text(text.replace(before, after, 1))
    with pytest.raises(StudyPlanError, match=f"sizing: no line for {key}"):
        load_plan(plan)
    plan.write_text(TIER1.read_text().replace(FIXED, "  fixed_on: null"))
    assert load_plan(plan).sizing.fixed_on is None  # the committed layout has every line
